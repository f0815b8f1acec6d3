"""Llama-3-8B transformer block (prefill), as in shared/BENCHMARKS.md.

Batch 4, sequence 2048, hidden 4096, 32 query heads and 8 KV heads (head dim 128), RoPE with
theta 500000, RMSNorm (eps 1e-5) written out by hand, no biases, SwiGLU MLP 4096 -> 14336 -> 4096.
`attention="sdpa"` uses F.scaled_dot_product_attention(is_causal=True); `attention="manual"` is
the hand-written variant (matmul, additive causal mask, fp32 softmax). A FACT problem file.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, SEQ, DIM, HEADS, KV_HEADS, FFN = 4, 2048, 4096, 32, 8, 14336
ROPE_THETA, NORM_EPS = 500000.0, 1e-5


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=NORM_EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    b, h, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


class Attention(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, max_seq, attention):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.attention = attention
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)
        inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        freqs = torch.outer(torch.arange(max_seq).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.cos[:s].to(q.dtype), self.sin[:s].to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            n_rep = self.n_heads // self.n_kv_heads
            k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
            scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
            mask = torch.full((s, s), float("-inf"), device=x.device).triu(1)
            scores = scores + mask
            probs = F.softmax(scores.float(), dim=-1).type_as(q)
            y = torch.matmul(probs, v)
        y = y.transpose(1, 2).contiguous().view(b, s, -1)
        return self.wo(y)


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Model(nn.Module):
    def __init__(self, dim=DIM, n_heads=HEADS, n_kv_heads=KV_HEADS, ffn=FFN, max_seq=SEQ, attention="sdpa"):
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, n_heads, n_kv_heads, max_seq, attention)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, ffn)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def get_inputs():
    return [torch.randn(BATCH, SEQ, DIM)]


def get_init_inputs():
    return []
