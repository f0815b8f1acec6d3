"""GPT-NeoX / Pythia-style block: parallel residual (x + attn(ln1(x)) + mlp(ln2(x))), one fused
QKV projection laid out per head as (heads, 3, head dim), causal SDPA, GELU (erf) MLP.

Batch 16, sequence 1024, width 1024, 16 heads of 64. A module FACT was not developed against: a
generality check.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, SEQ, WIDTH, HEADS = 16, 1024, 1024, 16


class Model(nn.Module):
    def __init__(self, dim=WIDTH, heads=HEADS):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.ln2 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.dense = nn.Linear(dim, dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, s, self.heads, 3, d // self.heads)
        q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = self.dense(a.transpose(1, 2).reshape(b, s, d))
        m = self.down(F.gelu(self.up(self.ln2(x))))
        return x + a + m


def get_inputs():
    return [torch.randn(BATCH, SEQ, WIDTH)]


def get_init_inputs():
    return []
