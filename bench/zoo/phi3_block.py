"""Phi-3-mini-style decoder block, written as Hugging Face's Phi3 modules are: one fused QKV
projection cut by slices, RoPE (rotate_half), causal SDPA, and one fused gate/up projection cut
by chunk(2) with up * silu(gate); RMSNorm written out (float32 statistics, weight last).

Batch 4, sequence 2048, width 3072, 32 heads of 96, MLP 3072 -> 8192 -> 3072, no biases. A
module FACT was not developed against: a generality check.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, SEQ, WIDTH, HEADS, FFN = 4, 2048, 3072, 32, 8192
ROPE_THETA, EPS = 10000.0, 1e-5


class RMSNorm(nn.Module):
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


class Model(nn.Module):
    def __init__(self, dim=WIDTH, heads=HEADS, ffn=FFN, max_seq=SEQ):
        super().__init__()
        self.heads, self.head_dim, self.ffn = heads, dim // heads, ffn
        self.input_layernorm = RMSNorm(dim)
        self.qkv_proj = nn.Linear(dim, 3 * dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)
        self.post_attention_layernorm = RMSNorm(dim)
        self.gate_up_proj = nn.Linear(dim, 2 * ffn, bias=False)
        self.down_proj = nn.Linear(ffn, dim, bias=False)
        d = self.head_dim
        inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, d, 2).float() / d))
        emb = torch.outer(torch.arange(max_seq).float(), inv_freq).repeat(1, 2)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x):
        b, s, c = x.shape
        qkv = self.qkv_proj(self.input_layernorm(x))
        q = qkv[..., :c].view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = qkv[..., c : 2 * c].view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = qkv[..., 2 * c :].view(b, s, self.heads, self.head_dim).transpose(1, 2)
        cos, sin = self.cos[:s].to(q.dtype), self.sin[:s].to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = x + self.o_proj(a.transpose(1, 2).reshape(b, s, c))
        gate, up = self.gate_up_proj(self.post_attention_layernorm(h)).chunk(2, dim=-1)
        return h + self.down_proj(up * F.silu(gate))


def get_inputs():
    return [torch.randn(BATCH, SEQ, WIDTH)]


def get_init_inputs():
    return []
