"""Trace and plan time of a Llama-style model from a transformers config, by layer count, and how
many distinct pattern classes (compiles, tunings, timings) its patterns make (issue 35). CPU only.

    python bench/plan_scale.py 4 32
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fact.compose.optimize import pattern_class
from fact.engine import engine_json
from fact.tracer import save_graph, trace


def main(layers: list[int]) -> None:
    print("| layers | graph nodes | trace + rewrites | plan | patterns | pattern classes |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n in layers:
        cfg = LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=n,
                          num_attention_heads=8, num_key_value_heads=2, vocab_size=32000,
                          max_position_embeddings=512, use_cache=False)  # fmt: skip
        cfg._attn_implementation = "sdpa"
        model = LlamaForCausalLM(cfg).eval()
        ids = torch.randint(0, 32000, (2, 128))
        start = time.perf_counter()
        graph = trace(model, [ids], arch="sm90")
        traced = time.perf_counter()
        path = save_graph(graph, Path(tempfile.mkdtemp()) / "graph.json")
        plan = engine_json("discover", path)
        planned = time.perf_counter()
        n_classes = len(Counter(pattern_class(p) for p in plan["patterns"]))
        print(f"| {n} | {len(graph['nodes'])} | {traced - start:.1f} s | {planned - traced:.2f} s "
              f"| {len(plan['patterns'])} | {n_classes} |")  # fmt: skip


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [4, 32])
