"""Two Llama-3-8B decoder layers as transformers builds them (LlamaModel from a config, random
weights, SDPA attention, its own causal mask and rotary embeddings), prefill of 4 x 2048 tokens.
Held out: FACT was not developed against it."""

import torch
import torch.nn as nn
from transformers import LlamaConfig, LlamaModel

BATCH, SEQ = 4, 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        config = LlamaConfig(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=2,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=8192,
            rope_theta=500000.0,
            rms_norm_eps=1e-5,
            vocab_size=128256,
            attn_implementation="sdpa",
        )
        self.model = LlamaModel(config)

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).last_hidden_state


def get_inputs():
    return [torch.randint(0, 128256, (BATCH, SEQ))]


def get_init_inputs():
    return []
