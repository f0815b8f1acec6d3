"""Small attention modules the composition tests optimize, on the CPU (reference twins) and on
the GPU (generated kernels): MiniGPT's hand-written causal attention and Llama's grouped-query
attention, through SDPA or written out with repeat_kv."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class HandWrittenAttention(nn.Module):
    """MiniGPT's causal self-attention, small: Q, K, V split from one c_attn projection, a tril
    buffer as the mask, dropout (p = 0 unless given), heads merged back by
    transpose(1, 2).contiguous().view(...)."""

    def __init__(self, width: int = 64, heads: int = 4, seq: int = 32, p: float = 0.0):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        self.attn_dropout = nn.Dropout(p)
        self.register_buffer("bias", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class GqaAttention(nn.Module):
    """Llama's attention, small (4 query heads, 2 key/value heads): sdpa=True calls SDPA with
    enable_gqa (dropout_p while training, when given); sdpa=False writes it out with repeat_kv
    (expand + reshape), an additive causal mask and an fp32 softmax."""

    def __init__(self, width=64, heads=4, kv_heads=2, sdpa=True, p=0.0):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, width // heads
        self.sdpa, self.p = sdpa, p
        self.wq = nn.Linear(width, heads * self.hd, bias=False)
        self.wk = nn.Linear(width, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(width, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(heads * self.hd, width, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, self.hd).transpose(1, 2)
        k = self.wk(x).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        v = self.wv(x).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        if self.sdpa:
            p = self.p if self.training else 0.0
            y = F.scaled_dot_product_attention(
                q, k, v, dropout_p=p, is_causal=True, enable_gqa=True
            )
        else:
            rep = self.heads // self.kv_heads
            k = k[:, :, None].expand(b, self.kv_heads, rep, s, self.hd).reshape(b, -1, s, self.hd)
            v = v[:, :, None].expand(b, self.kv_heads, rep, s, self.hd).reshape(b, -1, s, self.hd)
            scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.hd)
            mask = torch.full((s, s), float("-inf"), device=x.device).triu(1)
            probs = F.softmax((scores + mask).float(), dim=-1).type_as(q)
            y = torch.matmul(probs, v)
        return self.wo(y.transpose(1, 2).contiguous().view(b, s, -1))


class BiasedAttention(nn.Module):
    """Attention with an additive score bias, as two encoders write it.

    kind "position": T5's, a learned (1, heads, seq, seq) position bias added to unscaled
    scores, the softmax in f32 and cast back with .type_as(scores).
    kind "padding": BERT's, a (batch, seq) 0/1 mask input made additive as
    (1 - mask[:, None, None, :]) * finfo.min and added to the scaled scores.
    kind "causal_padding": a decoder's (GPT-2's as Hugging Face writes it), the scaled scores
    masked causally by torch.where(tril, scores, finfo.min), then the padding mask added."""

    def __init__(self, kind: str, width: int = 64, heads: int = 4, seq: int = 24):
        super().__init__()
        self.kind, self.heads = kind, heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        if kind == "position":
            self.position_bias = nn.Parameter(torch.randn(1, heads, seq, seq))

    def forward(self, x, mask=None):
        b, s, c = x.shape
        q, k, v = (
            t.view(b, s, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(c, dim=2)
        )
        if self.kind == "position":
            scores = torch.matmul(q, k.transpose(3, 2)) + self.position_bias
            probs = torch.softmax(scores.float(), dim=-1).type_as(scores)
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(c // self.heads)
            if self.kind == "causal_padding":
                keep = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
                floor = torch.full([], torch.finfo(scores.dtype).min, dtype=scores.dtype,
                                   device=x.device)  # fmt: skip
                scores = torch.where(keep, scores, floor)
            additive = (1.0 - mask[:, None, None, :].to(scores.dtype)) * torch.finfo(
                scores.dtype
            ).min
            probs = torch.softmax(scores + additive, dim=-1)
        y = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, c)
        return self.out(y)


class ScaledProjectionAttention(nn.Module):
    """Non-causal attention that scales Q or K before the product, as encoders write it.

    form "projection": CLIP's and BART's, q_proj(x) * scaling before the heads are split, and
    no scale on the scores. form "heads": OpenAI Whisper's, q and k each multiplied by
    head_dim ** -0.25 after they are viewed into heads (k already transposed)."""

    def __init__(self, form: str, width: int = 64, heads: int = 4):
        super().__init__()
        self.form, self.heads, self.hd = form, heads, width // heads
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width, bias=False)
        self.v_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x):
        b, s, c = x.shape
        if self.form == "projection":
            q = (self.q_proj(x) * self.hd**-0.5).view(b, s, self.heads, -1).transpose(1, 2)
            k = self.k_proj(x).view(b, s, self.heads, -1).transpose(1, 2)
            scores = q @ k.transpose(-1, -2)
        else:
            scale = self.hd**-0.25
            q = self.q_proj(x).view(b, s, self.heads, -1).permute(0, 2, 1, 3) * scale
            k = self.k_proj(x).view(b, s, self.heads, -1).permute(0, 2, 3, 1) * scale
            scores = q @ k
        v = self.v_proj(x).view(b, s, self.heads, -1).transpose(1, 2)
        y = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s, c)
        return self.out_proj(y)


class FoldedHeadsAttention(nn.Module):
    """Hugging Face's older encoder attention (CLIP, BART): heads folded into the batch,
    (b, s, h, d).transpose(1, 2).contiguous().view(b * h, s, d), and torch.bmm; Q scaled by
    its projection's epilogue."""

    def __init__(self, width: int = 64, heads: int = 4):
        super().__init__()
        self.heads, self.hd = heads, width // heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(width, width) for _ in range(4)
        )

    def _fold(self, t, b, s):
        t = t.view(b, s, self.heads, self.hd).transpose(1, 2).contiguous()
        return t.view(b * self.heads, s, self.hd)

    def forward(self, x):
        b, s, c = x.shape
        q = self._fold(self.q_proj(x) * self.hd**-0.5, b, s)
        k, v = self._fold(self.k_proj(x), b, s), self._fold(self.v_proj(x), b, s)
        w = torch.softmax(torch.bmm(q, k.transpose(1, 2)), dim=-1)
        y = torch.bmm(w, v).view(b, self.heads, s, self.hd).transpose(1, 2).reshape(b, s, c)
        return self.out_proj(y)


class Float32ScoresAttention(nn.Module):
    """GPT-J's causal attention: Q and K cast to f32 before Q @ K^T, masked by torch.where with
    a bool tril buffer and torch.tensor(finfo.min) (a lifted constant), then divided by
    sqrt(head_dim), softmax in f32, the probabilities cast back to V's dtype."""

    def __init__(self, width: int = 64, heads: int = 4, seq: int = 32):
        super().__init__()
        self.heads, self.hd = heads, width // heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(width, width, bias=False) for _ in range(4)
        )
        self.register_buffer("bias", torch.tril(torch.ones(seq, seq, dtype=torch.bool))[None, None])

    def forward(self, x):
        b, s, c = x.shape
        q, k, v = (
            p(x).view(b, s, self.heads, self.hd).permute(0, 2, 1, 3)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        w = torch.matmul(q.to(torch.float32), k.to(torch.float32).transpose(-1, -2))
        floor = torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)
        w = torch.where(self.bias[:, :, :s, :s], w, floor) / math.sqrt(self.hd)
        y = torch.matmul(torch.softmax(w, dim=-1).to(v.dtype), v)
        return self.out_proj(y.permute(0, 2, 1, 3).reshape(b, s, c))
