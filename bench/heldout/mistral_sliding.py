"""Two Mistral-7B decoder layers with a sliding attention window of 1024 over 2048 tokens, as
transformers builds them (MistralModel from a config, random weights, SDPA attention with its
own sliding-window mask), prefill of 2 x 2048 tokens. Held out: FACT was not developed against
it."""

import torch
import torch.nn as nn
from transformers import MistralConfig, MistralModel

BATCH, SEQ = 2, 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        config = MistralConfig(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=2,
            num_attention_heads=32,
            num_key_value_heads=8,
            sliding_window=1024,
            max_position_embeddings=8192,
            vocab_size=32000,
            attn_implementation="sdpa",
        )
        self.model = MistralModel(config)

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).last_hidden_state


def get_inputs():
    return [torch.randint(0, 32000, (BATCH, SEQ))]


def get_init_inputs():
    return []
