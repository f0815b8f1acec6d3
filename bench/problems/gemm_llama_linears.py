"""The three weight shapes of the Llama-3-8B block's linear layers (shared/BENCHMARKS.md: batch 4 x
seq 2048 tokens, hidden 4096, FFN 14336), each as a plain nn.Linear without bias: the MLP's gate
(and up) projection 8192x14336x4096, its down projection 8192x4096x14336 (K = 14336), and the
attention output projection 8192x4096x4096, each on its own input (a shared input would make
the gate and output projections one horizontal GEMM). Weights are K-major, as nn.Linear stores
them."""

import torch
import torch.nn as nn

TOKENS, DIM, FFN = 4 * 2048, 4096, 14336


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(DIM, FFN, bias=False)
        self.down = nn.Linear(FFN, DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x, h, y):
        return self.gate(x), self.down(h), self.wo(y)


def get_inputs():
    return [torch.randn(TOKENS, DIM), torch.randn(TOKENS, FFN), torch.randn(TOKENS, DIM)]


def get_init_inputs():
    return []
