"""Linear 2048->8192 at batch 4096, ELU, scale. Held out: FACT was not developed against it."""

import torch
import torch.nn as nn
import torch.nn.functional as F

M, K, N = 4096, 2048, 8192


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(K, N, bias=True)

    def forward(self, x):
        return F.elu(self.fc(x), alpha=0.8) * 2.0


def get_inputs():
    return [torch.randn(M, K)]


def get_init_inputs():
    return []
