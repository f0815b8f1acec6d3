"""Rotary embedding of Llama-3-8B's queries (BENCHMARKS.md shape: batch 4, seq 2048, 32 heads of
128, theta 500000), as the model writes it: q * cos + rotate_half(q) * sin on the transposed
projection. A pointwise region for FACT: one generated kernel reading q in place."""

import torch
import torch.nn as nn

B, S, H, D, THETA = 4, 2048, 32, 128, 500000.0


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        inv_freq = 1.0 / (THETA ** (torch.arange(0, D, 2).float() / D))
        freqs = torch.outer(torch.arange(S).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, xq):  # xq: the projection viewed (batch, seq, heads, dim)
        q = xq.transpose(1, 2)
        return q * self.cos + rotate_half(q) * self.sin


def get_inputs():
    return [torch.randn(B, S, H, D)]


def get_init_inputs():
    return []
