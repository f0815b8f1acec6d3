"""Linear 8192->8192 at batch 1024, add a parameter vector, SiLU, tanh, GELU, hardtanh. Held out:
FACT was not developed against it."""

import torch
import torch.nn as nn
import torch.nn.functional as F

M, K, N = 1024, 8192, 8192


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(K, N, bias=True)
        self.shift = nn.Parameter(torch.randn(8192) * 0.1)

    def forward(self, x):
        x = self.fc(x) + self.shift
        x = torch.tanh(F.silu(x))
        return F.hardtanh(F.gelu(x), -1.0, 1.0)


def get_inputs():
    return [torch.randn(M, K)]


def get_init_inputs():
    return []
