"""A pre-norm transformer block in the style of research codebases (x-transformers and its
kin): every projection an einsum over an (in, out) weight, attention scores and output as
einsums in (batch, heads, seq, dim) order with a causal mask from a bool tril buffer, and a
GEGLU feed-forward (one projection to twice the width, chunked, x * gelu(gate)).

Batch 8, sequence 1024, width 1024, 16 heads of 64, GEGLU 1024 -> 2 x 4096 -> 1024. A module
FACT was not developed against: a generality check.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, SEQ, WIDTH, HEADS, HIDDEN = 8, 1024, 1024, 16, 4096


class Model(nn.Module):
    def __init__(self, dim=WIDTH, heads=HEADS, hidden=HIDDEN, seq=SEQ):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.w_qkv = nn.Parameter(torch.randn(dim, 3 * dim) / math.sqrt(dim))
        self.w_out = nn.Parameter(torch.randn(dim, dim) / math.sqrt(dim))
        self.w_in = nn.Parameter(torch.randn(dim, 2 * hidden) / math.sqrt(dim))
        self.b_in = nn.Parameter(torch.zeros(2 * hidden))
        self.w_ff = nn.Parameter(torch.randn(hidden, dim) / math.sqrt(hidden))
        self.register_buffer("causal", torch.ones(seq, seq, dtype=torch.bool).tril())

    def forward(self, x):
        b, n, d = x.shape
        h = self.heads
        qkv = torch.einsum("bnd,de->bne", self.norm1(x), self.w_qkv)
        q, k, v = (t.view(b, n, h, d // h).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
        sim = torch.einsum("bhid,bhjd->bhij", q, k) * (d // h) ** -0.5
        sim = sim.masked_fill(~self.causal[:n, :n], -torch.finfo(sim.dtype).max)
        out = torch.einsum("bhij,bhjd->bhid", sim.softmax(dim=-1), v)
        x = x + torch.einsum("bnd,de->bne", out.transpose(1, 2).reshape(b, n, d), self.w_out)
        proj = torch.einsum("bnd,de->bne", self.norm2(x), self.w_in) + self.b_in
        u, gate = proj.chunk(2, dim=-1)
        return x + torch.einsum("bnf,fd->bnd", u * F.gelu(gate), self.w_ff)


def get_inputs():
    return [torch.randn(BATCH, SEQ, WIDTH)]


def get_init_inputs():
    return []
