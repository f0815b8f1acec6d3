"""Linear 8192->8192 at batch 1024, subtract, multiply, ReLU. Held out: FACT was not developed
against it."""

import torch
import torch.nn as nn

M, K, N = 1024, 8192, 8192


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(K, N, bias=True)

    def forward(self, x):
        return torch.relu((self.fc(x) - 0.25) * 1.75)


def get_inputs():
    return [torch.randn(M, K)]


def get_init_inputs():
    return []
