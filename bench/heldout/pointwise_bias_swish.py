"""A bias add and the sigmoid-approximated GELU (x * sigmoid(1.702 x)) on 16384 x 8192
activations (256 MB in, 256 MB out in bf16). Held out: FACT was not developed against it."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(8192) * 0.1)

    def forward(self, x):
        y = x + self.bias
        return y * torch.sigmoid(1.702 * y)


def get_inputs():
    return [torch.randn(16384, 8192)]


def get_init_inputs():
    return []
