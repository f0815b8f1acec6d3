"""Small modules with pointwise regions the other patterns leave over, for the composition tests
on the CPU (reference twins) and on the GPU (generated kernels): Llama's rotary position
embedding (RoPE) on Q and K straight from their projections."""

from __future__ import annotations

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Llama's rotate_half: cat(-x2, x1) of the last dim's two halves."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope_tables(seq: int, dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [seq, dim] in float32, as Llama's rotary embedding computes them."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return q * cos + rotate_half(q) * sin


class RopeProjection(nn.Module):
    """Llama's attention input: Q (and K, with fewer heads) projected, viewed per head and
    transposed to (B, H, S, D) without a copy, then rotated: q * cos + rotate_half(q) * sin with
    cos and sin [S, D] buffers cast to the model's dtype. Returns both, still (B, S, H, D) in
    memory as eager leaves them."""

    def __init__(self, width: int = 64, heads: int = 4, kv_heads: int = 2, seq: int = 32):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, width // heads
        self.wq = nn.Linear(width, heads * self.hd, bias=False)
        self.wk = nn.Linear(width, kv_heads * self.hd, bias=False)
        cos, sin = rope_tables(seq, self.hd)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, self.hd).transpose(1, 2)
        k = self.wk(x).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        cos, sin = self.cos[:s].to(x.dtype), self.sin[:s].to(x.dtype)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)


class PointwiseZoo(nn.Module):
    """Pointwise regions that exercise the kernels' other paths, each one region with inputs
    only (no GEMM in front):

    - a transposed input (last dim strided) against a column broadcast along the last dim;
    - x - x[..., :1] (a one-column slice: a broadcast operand, not an index shift), then a mask
      through where;
    - f32 inputs with a bf16 cast and an odd row length (12: narrower vectors; rows not on
      8-element boundaries are read strided);
    - silu(gate) * up, the gated MLP's tail.

    Inputs (see zoo_inputs): a [B, N, M] and at [B, M, N] (transposed inside), col [B, N, 1],
    m [B, N, M] bool, f [B, N, 12] float32, gate and up [B, N, M].
    """

    def forward(self, a, at, col, m, f, gate, up):
        r1 = torch.tanh(at.transpose(1, 2)) * col + a
        r2 = torch.where(m, (a - a[..., :1]) * 0.5, -a)
        r3 = (torch.sigmoid(f) * 2.0 - f).to(a.dtype)
        r4 = torch.nn.functional.silu(gate) * up
        return r1, r2, r3, r4


def zoo_inputs(batch=2, n=24, m=64, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dt)

    return [
        rnd(batch, n, m),
        rnd(batch, m, n),
        rnd(batch, n, 1),
        (torch.rand(batch, n, m, generator=g) > 0.5).to(device),
        rnd(batch, n, 12, dt=torch.float32),
        rnd(batch, n, m),
        rnd(batch, n, m),
    ]
