"""Large-K GEMM 256 x 256, K = 524288, with B stored K-major (a @ w^T)."""
import torch
import torch.nn as nn

K = 524288


class Model(nn.Module):
    def forward(self, a, w):
        return a @ w.t()


def get_inputs():
    return [torch.rand(256, K), torch.rand(256, K)]


def get_init_inputs():
    return []
