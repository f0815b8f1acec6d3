"""GEMM + bias + GELU(tanh), 65536 x 3072 x 768: the MiniGPT MLP up-projection (BENCHMARKS.md)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(768, 3072)

    def forward(self, x):
        return F.gelu(self.fc(x), approximate="tanh")


def get_inputs():
    return [torch.randn(65536, 768)]


def get_init_inputs():
    return []
