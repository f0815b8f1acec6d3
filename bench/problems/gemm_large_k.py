"""Large-K GEMM 256 x 256 with K = 524288 (shared/BENCHMARKS.md): few output tiles, long K."""

import torch
import torch.nn as nn

K = 524288


class Model(nn.Module):
    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.rand(256, K), torch.rand(K, 256)]


def get_init_inputs():
    return []
