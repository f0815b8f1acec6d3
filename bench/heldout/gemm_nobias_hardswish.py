"""Linear 8192->8192 at batch 1024 without bias, Hardswish. Held out: FACT was not developed
against it."""

import torch
import torch.nn as nn
import torch.nn.functional as F

M, K, N = 1024, 8192, 8192


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(K, N, bias=False)

    def forward(self, x):
        return F.hardswish(self.fc(x))


def get_inputs():
    return [torch.randn(M, K)]


def get_init_inputs():
    return []
