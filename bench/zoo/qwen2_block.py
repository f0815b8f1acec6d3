"""Qwen2-7B-style decoder block, written as Hugging Face's Qwen2 modules are: q/k/v projections
with biases (o_proj without), GQA with 28 query and 4 KV heads of 128 made wide by repeat_kv,
RoPE (rotate_half, theta 1e6), causal SDPA, RMSNorm (float32 statistics, weight last), and a
SwiGLU MLP down(silu(gate(x)) * up(x)).

Batch 2, sequence 2048, width 3584, MLP 3584 -> 18944 -> 3584. A module FACT was not developed
against: a generality check.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, SEQ, WIDTH, HEADS, KV_HEADS, FFN = 2, 2048, 3584, 28, 4, 18944
ROPE_THETA, EPS = 1000000.0, 1e-6


class Qwen2RMSNorm(nn.Module):
    def __init__(self, dim, eps=EPS):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    b, h, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


class Model(nn.Module):
    def __init__(self, dim=WIDTH, heads=HEADS, kv_heads=KV_HEADS, ffn=FFN, max_seq=SEQ):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        d = self.head_dim
        self.input_layernorm = Qwen2RMSNorm(dim)
        self.q_proj = nn.Linear(dim, heads * d, bias=True)
        self.k_proj = nn.Linear(dim, kv_heads * d, bias=True)
        self.v_proj = nn.Linear(dim, kv_heads * d, bias=True)
        self.o_proj = nn.Linear(heads * d, dim, bias=False)
        self.post_attention_layernorm = Qwen2RMSNorm(dim)
        self.gate_proj = nn.Linear(dim, ffn, bias=False)
        self.up_proj = nn.Linear(dim, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, dim, bias=False)
        inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, d, 2).float() / d))
        freqs = torch.outer(torch.arange(max_seq).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.cos[:s].to(q.dtype), self.sin[:s].to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        n_rep = self.heads // self.kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, s, -1))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def get_inputs():
    return [torch.randn(BATCH, SEQ, WIDTH)]


def get_init_inputs():
    return []
