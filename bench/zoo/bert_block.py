"""BERT-large encoder layer (post-norm) with a padding mask: attention over 16 heads of 64 with
an additive mask built from a (batch, seq) 0/1 input, output projection, residual, LayerNorm;
GELU (erf) feed-forward 1024 -> 4096 -> 1024, residual, LayerNorm.

Batch 32, sequence 320 (not a multiple of 128), the last 64 positions of every other sequence
padded. A module FACT was not developed against: a generality check.
"""

import math

import torch
import torch.nn as nn

BATCH, SEQ, HIDDEN, HEADS = 32, 320, 1024, 16


class Model(nn.Module):
    def __init__(self, hidden=HIDDEN, heads=HEADS):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)
        self.ln_attn = nn.LayerNorm(hidden, eps=1e-12)
        self.inter = nn.Linear(hidden, 4 * hidden)
        self.output = nn.Linear(4 * hidden, hidden)
        self.ln_out = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x, attention_mask):
        b, s, d = x.shape

        def heads(t):
            return t.view(b, s, self.heads, -1).permute(0, 2, 1, 3)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // self.heads)
        mask = (1.0 - attention_mask[:, None, None, :].to(scores.dtype)) * torch.finfo(
            scores.dtype
        ).min
        probs = torch.softmax(scores + mask, dim=-1)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(b, s, d)
        x = self.ln_attn(x + self.out(ctx))
        return self.ln_out(x + self.output(nn.functional.gelu(self.inter(x))))


def get_inputs():
    mask = torch.ones(BATCH, SEQ)
    mask[1::2, -64:] = 0
    return [torch.randn(BATCH, SEQ, HIDDEN), mask]


def get_init_inputs():
    return []
