"""Linear 4096->4096 at batch 2048, x * sigmoid(y) with the input as gate. Held out: FACT was not
developed against it."""

import torch
import torch.nn as nn

M, K, N = 2048, 4096, 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(K, N, bias=True)

    def forward(self, x):
        return x * torch.sigmoid(self.fc(x))


def get_inputs():
    return [torch.randn(M, K)]


def get_init_inputs():
    return []
