"""The product of Llama-3-8B's SwiGLU MLP (BENCHMARKS.md shape: 8192 tokens, hidden 14336):
silu(gate) * up on the two projections' outputs. A pointwise region for FACT, and the `tail`
a gated MLP runs after two library GEMMs."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS, HIDDEN = 8192, 14336


class Model(nn.Module):
    def forward(self, gate, up):
        return F.silu(gate) * up


def get_inputs():
    return [torch.randn(4, TOKENS // 4, HIDDEN), torch.randn(4, TOKENS // 4, HIDDEN)]


def get_init_inputs():
    return []
