"""CLIP ViT-L/14 vision encoder layer, written as Hugging Face's CLIPEncoderLayer eager path
is: pre-LayerNorms, q_proj(x) * scale before the heads are split, heads folded into the batch
for torch.bmm ((batch * heads, seq, head_dim) through view and reshape), softmax, and an MLP
with quick_gelu (x * sigmoid(1.702 x)).

Batch 32, 257 tokens (16 x 16 patches and the class token), width 1024, 16 heads of 64, MLP
1024 -> 4096 -> 1024, biases everywhere. A module FACT was not developed against: a generality
check.
"""

import torch
import torch.nn as nn

BATCH, SEQ, WIDTH, HEADS, FFN = 32, 257, 1024, 16, 4096


class Attention(nn.Module):
    def __init__(self, dim=WIDTH, heads=HEADS):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim**-0.5
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.q_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def _shape(self, t, seq, bsz):
        return t.view(bsz, seq, self.heads, self.head_dim).transpose(1, 2).contiguous()

    def forward(self, x):
        bsz, tgt, dim = x.shape
        query = self.q_proj(x) * self.scale
        key = self._shape(self.k_proj(x), -1, bsz)
        value = self._shape(self.v_proj(x), -1, bsz)
        proj_shape = (bsz * self.heads, -1, self.head_dim)
        query = self._shape(query, tgt, bsz).view(*proj_shape)
        key, value = key.view(*proj_shape), value.view(*proj_shape)
        weights = torch.softmax(torch.bmm(query, key.transpose(1, 2)), dim=-1)
        out = torch.bmm(weights, value).view(bsz, self.heads, tgt, self.head_dim)
        return self.out_proj(out.transpose(1, 2).reshape(bsz, tgt, dim))


class Model(nn.Module):
    def __init__(self, dim=WIDTH, heads=HEADS, ffn=FFN):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.self_attn = Attention(dim, heads)
        self.layer_norm2 = nn.LayerNorm(dim, eps=1e-5)
        self.fc1 = nn.Linear(dim, ffn)
        self.fc2 = nn.Linear(ffn, dim)

    def forward(self, x):
        x = x + self.self_attn(self.layer_norm1(x))
        h = self.fc1(self.layer_norm2(x))
        return x + self.fc2(h * torch.sigmoid(1.702 * h))


def get_inputs():
    return [torch.randn(BATCH, SEQ, WIDTH)]


def get_init_inputs():
    return []
