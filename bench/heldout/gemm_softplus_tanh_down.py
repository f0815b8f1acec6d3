"""Linear 8192->2048 at batch 1024, softplus then tanh. Held out: FACT was not developed against
it."""

import torch
import torch.nn as nn
import torch.nn.functional as F

M, K, N = 1024, 8192, 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(K, N, bias=True)

    def forward(self, x):
        return torch.tanh(F.softplus(self.fc(x)))


def get_inputs():
    return [torch.randn(M, K)]


def get_init_inputs():
    return []
