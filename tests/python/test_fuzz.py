"""Bounded fuzzing of what other people hand over (issue 32): random mutations of a real graph
JSON and of the shipped registry seed go through `fact-engine validate`, `discover` and
`registry import`. Whatever the input, the engine answers with exit 0, 1 or 2 (a user error
naming what is wrong): never a crash (a signal), a hang, or exit 3 (an internal error).

The mutations are drawn from fixed seeds, so a failure reproduces; FACT_FUZZ_CASES runs more.
"""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess

import pytest
import torch
from torch import nn

import fact
from helpers import REPO

CASES = int(os.environ.get("FACT_FUZZ_CASES", "150"))
ODD_VALUES = [
    None, True, -1, 0, 2**63, -(2**63) - 1, 1e308, -0.0, "", "\x00", "x\r#include <x>", "∞",
    [], {}, [[]], {"node": "nosuch"}, {"node": 7}, "f32[", "bf16", "aten.mm.default",
]  # fmt: skip


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.norm = nn.LayerNorm(32)

    def forward(self, x):
        h = self.norm(x)
        return x + torch.nn.functional.gelu(self.fc(h)) * torch.sigmoid(h)


@pytest.fixture(scope="module")
def graph() -> dict:
    torch.manual_seed(0)
    return json.loads(json.dumps(fact.trace(Block().eval(), [torch.randn(4, 8, 32)])))


def _paths(doc, prefix=()):
    """Every (path, value) in a JSON document."""
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


def _mutate(doc, rng: random.Random):
    doc = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 4)):
        paths = [p for p, _ in _paths(doc) if p]
        path = rng.choice(paths)
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        what = rng.random()
        if what < 0.4:
            parent[key] = rng.choice(ODD_VALUES)
        elif what < 0.6 and isinstance(parent, dict):
            del parent[key]
        elif what < 0.75 and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(parent[rng.randrange(len(parent))]))
        elif (
            what < 0.9
            and isinstance(parent[key], (int, float))
            and not isinstance(parent[key], bool)
        ):
            parent[key] = rng.choice([-1, 0, 1, 3, 2**31, -(2**40), 10**18]) * (parent[key] or 1)
        else:
            parent[key] = rng.choice(paths)[-1] if paths else None
    return doc


def _text(doc, rng: random.Random) -> str:
    text = json.dumps(doc)
    if rng.random() < 0.2:  # cut short, as a broken copy would be
        text = text[: rng.randrange(1, len(text))]
    return text


def _run(engine, *args) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            [str(engine), *map(str, args)], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"fact-engine {' '.join(map(str, args))} hung")


def _check(done, case: str) -> None:
    assert done.returncode in (0, 1, 2), (
        f"{case}: exit {done.returncode} (a signal if negative, 3 an internal error)\n"
        f"{done.stderr[-2000:]}"
    )


def test_mutated_graphs_never_crash_the_engine(engine_available, graph, tmp_path):
    rng = random.Random(20261207)
    for i in range(CASES):
        path = tmp_path / f"graph{i}.json"
        path.write_text(_text(_mutate(graph, rng), rng))
        for command in ("validate", "discover"):
            _check(_run(engine_available, command, path), f"{command} of case {i} ({path})")


def test_mutated_registry_exports_never_crash_the_engine(engine_available, tmp_path):
    seed = json.loads((REPO / "data" / "registry_seed.json").read_text())
    seed["rows"] = seed["rows"][:12]
    rng = random.Random(1207)
    for i in range(CASES):
        path = tmp_path / f"rows{i}.json"
        path.write_text(_text(_mutate(seed, rng), rng))
        registry = tmp_path / f"r{i}.db"
        done = _run(engine_available, "registry", "--registry", registry, "import", path)
        _check(done, f"import of case {i} ({path})")
        if done.returncode == 0:
            listed = _run(engine_available, "registry", "--registry", registry, "list")
            _check(listed, f"list after case {i}")


def test_the_fuzzer_mutates(graph):
    """The mutations change the document (a fuzzer that returns its input tests nothing)."""
    rng = random.Random(3)
    assert all(_mutate(graph, rng) != graph for _ in range(20))
