"""Square GEMM 4096 x 4096 x 4096 (shared/BENCHMARKS.md): D = A @ B, both row-major."""

import torch
import torch.nn as nn

N = 4096


class Model(nn.Module):
    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.rand(N, N), torch.rand(N, N)]


def get_init_inputs():
    return []
