"""T5 encoder layer as Hugging Face writes it: RMS norm without mean or bias (variance in fp32),
attention without the 1/sqrt(d) scale plus a learned position bias added to the scores, and a
ReLU feed-forward without biases.

Batch 32, sequence 512, d_model 512, 8 heads of 64, d_ff 2048. A module FACT was not developed
against: a generality check.
"""

import torch
import torch.nn as nn

BATCH, SEQ, D_MODEL, HEADS, D_FF = 32, 512, 512, 8, 2048


class T5LayerNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x.to(self.weight.dtype)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_attn = T5LayerNorm(D_MODEL)
        self.q = nn.Linear(D_MODEL, D_MODEL, bias=False)
        self.k = nn.Linear(D_MODEL, D_MODEL, bias=False)
        self.v = nn.Linear(D_MODEL, D_MODEL, bias=False)
        self.o = nn.Linear(D_MODEL, D_MODEL, bias=False)
        self.position_bias = nn.Parameter(0.1 * torch.randn(1, HEADS, SEQ, SEQ))
        self.ln_ff = T5LayerNorm(D_MODEL)
        self.wi = nn.Linear(D_MODEL, D_FF, bias=False)
        self.wo = nn.Linear(D_FF, D_MODEL, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.ln_attn(x)

        def heads(t):
            return t.view(b, s, HEADS, -1).transpose(1, 2)

        q, k, v = heads(self.q(h)), heads(self.k(h)), heads(self.v(h))
        scores = torch.matmul(q, k.transpose(3, 2)) + self.position_bias
        weights = torch.softmax(scores.float(), dim=-1).type_as(scores)
        y = torch.matmul(weights, v).transpose(1, 2).reshape(b, s, -1)
        x = x + self.o(y)
        return x + self.wo(torch.relu(self.wi(self.ln_ff(x))))


def get_inputs():
    return [torch.randn(BATCH, SEQ, D_MODEL)]


def get_init_inputs():
    return []
