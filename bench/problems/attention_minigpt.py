"""Causal self-attention at the MiniGPT shape (BENCHMARKS.md): batch 128, seq 512, 8 heads of 96,
written by hand over the fused QKV projection's output, as the MiniGPT block does. Eager runs the
hand-written form; the tuner's PyTorch candidate is scaled_dot_product_attention (flash)."""

import math

import torch
import torch.nn as nn

B, S, H, D = 128, 512, 8, 96


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.tril(torch.ones(S, S)).view(1, 1, S, S))

    def forward(self, qkv):
        b, s, _ = qkv.shape
        q, k, v = qkv.split(H * D, dim=2)
        q = q.view(b, s, H, D).transpose(1, 2)
        k = k.view(b, s, H, D).transpose(1, 2)
        v = v.view(b, s, H, D).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        att = att.masked_fill(self.mask[:, :, :s, :s] == 0, float("-inf"))
        y = torch.softmax(att, dim=-1) @ v
        return y.transpose(1, 2).contiguous().view(b, s, H * D)


def get_inputs():
    return [torch.randn(B, S, 3 * H * D)]


def get_init_inputs():
    return []
