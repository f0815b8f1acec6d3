"""A small GEMM with a bias + sigmoid + residual tail (64 x 512 x 256): a problem under one wave
of tiles, where small tiles win."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 512)

    def forward(self, x, r):
        return torch.sigmoid(self.fc(x)) + r


def get_inputs():
    return [torch.randn(64, 256), torch.randn(64, 512)]


def get_init_inputs():
    return []
