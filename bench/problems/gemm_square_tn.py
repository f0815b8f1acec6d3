"""Square GEMM 4096^3 with B stored K-major (B = W^T, W [n, k] row-major: the layout of
nn.Linear weights and of q @ k^T): the layout tf32 tensor cores read without a transpose."""
import torch
import torch.nn as nn

N = 4096


class Model(nn.Module):
    def forward(self, a, w):
        return a @ w.t()


def get_inputs():
    return [torch.rand(N, N), torch.rand(N, N)]


def get_init_inputs():
    return []
