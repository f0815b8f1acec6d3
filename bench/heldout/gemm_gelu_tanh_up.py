"""Linear 4096->16384 at batch 512, tanh GELU (an MLP up-projection at decode-like M). Held out:
FACT was not developed against it."""

import torch
import torch.nn as nn
import torch.nn.functional as F

M, K, N = 512, 4096, 16384


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(K, N, bias=True)

    def forward(self, x):
        return F.gelu(self.fc(x), approximate="tanh")


def get_inputs():
    return [torch.randn(M, K)]


def get_init_inputs():
    return []
