"""GPT-2 block as Hugging Face's eager path writes it: Conv1D layers (addmm with a row-major
[in, out] weight), a bool tril buffer with torch.where and finfo.min as the causal mask, the
scores divided by a 0-dim tensor, the tanh GELU written out. An optional 0/1 attention mask
per key (batched inference with padding) is made additive and added to the masked scores, as
Hugging Face's eager path does; gpt2_padded_block.py passes one.

Batch 32, sequence 1024, width 768, 12 heads of 64. A module FACT was not developed against: a
generality check.
"""

import math

import torch
import torch.nn as nn

BATCH, SEQ, WIDTH, HEADS = 32, 1024, 768, 12


class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        out_shape = x.size()[:-1] + (self.weight.size(-1),)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(out_shape)


def gelu_new(x):
    return (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    )


class Model(nn.Module):
    def __init__(self, width=WIDTH, heads=HEADS, seq=SEQ):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.c_attn = Conv1D(3 * width, width)
        self.attn_proj = Conv1D(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.c_fc = Conv1D(4 * width, width)
        self.mlp_proj = Conv1D(width, 4 * width)
        self.register_buffer(
            "bias", torch.tril(torch.ones(seq, seq, dtype=torch.bool)).view(1, 1, seq, seq)
        )

    def attn(self, x, attention_mask=None):
        b, s, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (t.view(b, s, self.heads, -1).permute(0, 2, 1, 3) for t in (q, k, v))
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
        mask = self.bias[:, :, :s, :s]
        floor = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)
        w = torch.where(mask, w.to(w.dtype), floor)
        if attention_mask is not None:  # batched inference: 0/1 per key, made additive
            w = w + (1.0 - attention_mask[:, None, None, :].to(w.dtype)) * torch.finfo(w.dtype).min
        w = nn.functional.softmax(w, dim=-1).type(v.dtype)
        y = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous().view(b, s, c)
        return self.attn_proj(y)

    def forward(self, x, attention_mask=None):
        x = x + self.attn(self.ln_1(x), attention_mask)
        return x + self.mlp_proj(gelu_new(self.c_fc(self.ln_2(x))))


def get_inputs():
    return [torch.randn(BATCH, SEQ, WIDTH)]


def get_init_inputs():
    return []
