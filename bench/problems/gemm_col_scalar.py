"""A GEMM whose tail reads a column vector and a scalar tensor (sm80 visitor leaves)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(1024, 2048)

    def forward(self, x, s, t):
        return torch.relu(self.fc(x) * s - t)


def get_inputs():
    return [torch.randn(4096, 1024), torch.rand(4096, 1), torch.tensor(0.1)]


def get_init_inputs():
    return []
