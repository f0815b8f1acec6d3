"""The tanh GELU written out, on 8192 x 8192 activations (128 MB in, 128 MB out in bf16). Held
out: FACT was not developed against it."""

import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def get_inputs():
    return [torch.randn(8192, 8192)]


def get_init_inputs():
    return []
