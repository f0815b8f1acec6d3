"""Batched GEMM 128 x (512 x 1024 @ 1024 x 2048) (shared/BENCHMARKS.md)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b)


def get_inputs():
    return [torch.rand(128, 512, 1024), torch.rand(128, 1024, 2048)]


def get_init_inputs():
    return []
