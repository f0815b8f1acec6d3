"""Batched GEMM 128 x (512 x 1024 @ 1024 x 2048) with B stored K-major (bmm(a, w^T))."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, w):
        return torch.bmm(a, w.transpose(1, 2))


def get_inputs():
    return [torch.rand(128, 512, 1024), torch.rand(128, 2048, 1024)]


def get_init_inputs():
    return []
