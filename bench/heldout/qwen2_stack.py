"""Two Qwen2-7B decoder layers as transformers builds them (Qwen2Model from a config, random
weights, biases on Q/K/V, SDPA attention with its own causal mask), prefill of 4 x 1024 tokens.
Held out: FACT was not developed against it."""

import torch
import torch.nn as nn
from transformers import Qwen2Config, Qwen2Model

BATCH, SEQ = 4, 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        config = Qwen2Config(
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=2,
            num_attention_heads=28,
            num_key_value_heads=4,
            max_position_embeddings=4096,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            vocab_size=152064,
            attn_implementation="sdpa",
        )
        self.model = Qwen2Model(config)

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).last_hidden_state


def get_inputs():
    return [torch.randint(0, 152064, (BATCH, SEQ))]


def get_init_inputs():
    return []
