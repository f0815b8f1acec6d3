"""A dozen GEMMs with different pointwise tails (issue 3's generality check): each branch is its
own linear layer on its own input, so each becomes one GEMM + epilogue pattern."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

M, K, N = 8192, 1024, 2048


def hand_gelu_tanh(y):
    inner = math.sqrt(2.0 / math.pi) * (y + 0.044715 * torch.pow(y, 3.0))
    return 0.5 * y * (1.0 + torch.tanh(inner))


TAILS = [
    ("scale_leaky_relu", lambda m, y, r: F.leaky_relu(y * 0.5, 0.2)),
    ("sub_vector_mul_relu", lambda m, y, r: torch.relu((y - m.vec) * 3.0)),
    ("sigmoid_residual", lambda m, y, r: torch.sigmoid(y) + r),
    ("mish", lambda m, y, r: F.mish(y)),
    ("hardtanh_gelu", lambda m, y, r: F.gelu(F.hardtanh(y))),
    ("silu", lambda m, y, r: F.silu(y)),
    ("gelu_tanh_by_hand", lambda m, y, r: hand_gelu_tanh(y)),
    ("clamp_residual", lambda m, y, r: torch.clamp(y, -1.0, 6.0) + r),
    ("div_tanh", lambda m, y, r: torch.tanh(y / 4.0)),
    ("elu_scale", lambda m, y, r: F.elu(y) * 1.5),
    ("swish_by_hand", lambda m, y, r: y * torch.sigmoid(y)),
    ("softplus_sub", lambda m, y, r: F.softplus(y) - m.vec),
]


class Branch(nn.Module):
    def __init__(self, tail):
        super().__init__()
        self.fc = nn.Linear(K, N)
        self.register_buffer("vec", torch.randn(N))
        self.tail = tail

    def forward(self, x, r):
        return self.tail(self, self.fc(x), r)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.branches = nn.ModuleList(Branch(tail) for _, tail in TAILS)

    def forward(self, *xs):
        residual = xs[-1]
        return tuple(b(x, residual) for b, x in zip(self.branches, xs[:-1], strict=True))


def get_inputs():
    return [torch.randn(M, K) for _ in TAILS] + [torch.randn(M, N)]


def get_init_inputs():
    return []
