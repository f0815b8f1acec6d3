"""Linear 8192->8192 at batch 1024, scale, hardtanh, GELU. Held out: FACT was not developed against
it."""

import torch
import torch.nn as nn
import torch.nn.functional as F

M, K, N = 1024, 8192, 8192


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(K, N, bias=True)

    def forward(self, x):
        x = self.fc(x) * 1.5
        x = F.hardtanh(x, min_val=-2.0, max_val=2.0)
        return F.gelu(x)


def get_inputs():
    return [torch.randn(M, K)]


def get_init_inputs():
    return []
