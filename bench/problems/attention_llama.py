"""Causal grouped-query attention at the Llama-3-8B shape (BENCHMARKS.md): batch 4, seq 2048, 32
query heads and 8 key/value heads of 128, written by hand with repeat_kv as in Llama's reference
code. Q, K and V come from separate projections, (batch, seq, heads * dim). Eager runs the
hand-written form; the tuner's PyTorch candidate is scaled_dot_product_attention (flash, GQA)."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

B, S, H, HKV, D = 4, 2048, 32, 8, 128


def repeat_kv(x, n_rep):
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


class Model(nn.Module):
    def forward(self, xq, xk, xv):
        b, s, _ = xq.shape
        q = xq.view(b, s, H, D).transpose(1, 2)
        k = repeat_kv(xk.view(b, s, HKV, D).transpose(1, 2), H // HKV)
        v = repeat_kv(xv.view(b, s, HKV, D).transpose(1, 2), H // HKV)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(D)
        mask = torch.full((s, s), float("-inf"), device=xq.device).triu(1)
        probs = F.softmax((scores + mask).float(), dim=-1).type_as(q)
        y = torch.matmul(probs, v)
        return y.transpose(1, 2).contiguous().view(b, s, H * D)


def get_inputs():
    return [torch.randn(B, S, H * D), torch.randn(B, S, HKV * D), torch.randn(B, S, HKV * D)]


def get_init_inputs():
    return []
