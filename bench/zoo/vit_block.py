"""ViT-B/16 encoder block (timm's Block layout) through torch.nn.MultiheadAttention.

Batch 64, 197 tokens (196 patches and a class token: not a multiple of any tile), width 768,
12 heads (head dim 64), pre-norm LayerNorm (eps 1e-6), non-causal attention, MLP 768 -> 3072 ->
768 with nn.GELU() (erf). A module FACT was not developed against: a generality check.
"""

import torch
import torch.nn as nn

BATCH, TOKENS, WIDTH, HEADS = 64, 197, 768, 12


class Model(nn.Module):
    def __init__(self, dim=WIDTH, heads=HEADS):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


def get_inputs():
    return [torch.randn(BATCH, TOKENS, WIDTH)]


def get_init_inputs():
    return []
