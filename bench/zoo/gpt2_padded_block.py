"""The GPT-2 block of gpt2_block.py in batched inference with right padding: a 0/1 mask per
key (1 for a token, 0 for padding; eight sequence lengths from 1024 down to 800 across the
batch), made additive with finfo.min and added to the causally masked scores, as Hugging
Face's eager path does. A score bias under a causal mask: the attention runs as SDPA with one
attn_mask.
"""

import torch
from gpt2_block import BATCH, SEQ, WIDTH, Model  # noqa: F401  (the problem's Model)


def get_inputs():
    mask = torch.ones(BATCH, SEQ)
    for i in range(BATCH):
        mask[i, SEQ - 32 * (i % 8) :] = 0
    return [torch.randn(BATCH, SEQ, WIDTH), mask]


def get_init_inputs():
    return []
