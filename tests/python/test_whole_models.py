"""Whole models (issue 35): identical layers are identical work. Planned on the CPU from small
transformers configs; the GPU side (one compile and tuning per class) is in fact.tune.runs."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import torch

import fact
from fact.compose.optimize import pattern_class

transformers = pytest.importorskip("transformers")


def llama(layers: int):
    cfg = transformers.LlamaConfig(
        hidden_size=128, intermediate_size=352, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256, use_cache=False,
    )  # fmt: skip
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval(), torch.randint(0, 1000, (2, 64))


def classes(plan: dict) -> Counter:
    return Counter(pattern_class(p) for p in plan["patterns"])


def test_identical_layers_add_patterns_but_no_new_work(engine_available):
    two, ids = llama(2)
    six, _ = llama(6)
    plan2, plan6 = fact.discover(two, [ids]), fact.discover(six, [ids])
    assert len(plan6["patterns"]) > len(plan2["patterns"])
    assert set(classes(plan6)) == set(classes(plan2)), "a layer's patterns differ by layer"
    families = Counter(p["family"] for p in plan6["patterns"])
    assert families["attention"] == 6 and families["gated_mlp"] == 6, families
    assert not plan6["pytorch_nodes"] or len(plan6["pytorch_nodes"]) == len(plan2["pytorch_nodes"])


def test_tracing_and_planning_32_layers_take_seconds(engine_available):
    model, ids = llama(32)
    start = time.perf_counter()
    plan = fact.discover(model, [ids])
    seconds = time.perf_counter() - start
    assert len(plan["patterns"]) >= 32 * 8
    assert len(classes(plan)) <= 12
    assert seconds < 60, f"trace and plan of 32 layers took {seconds:.1f} s"
