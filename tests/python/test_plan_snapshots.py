"""Every shipped module's plan, kept: examples/, bench/problems/ and bench/zoo/ planned for sm90 in
bf16 and compared with tests/golden/plans/<folder>/<name>.json.

A change that moves code (a family to its own folder, a parser shared) must leave every plan as
it was; a change meant to alter plans shows exactly which, in the diff of these files. The
snapshot keeps what a plan decides (each pattern's rule, family, nodes, operands, epilogue,
problem, attributes and search space; what stays in PyTorch and why), not the cost model's
estimates, and plans with an empty registry (no vetted rows, no agent lowerings), so it does not
depend on the machine's registry.

    FACT_UPDATE_GOLDEN=1 pytest tests/python/test_plan_snapshots.py   # write them anew
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import REPO

GOLDEN = REPO / "tests" / "golden" / "plans"
SOURCES = sorted(
    p.relative_to(REPO)
    for folder in ("examples", "bench/problems", "bench/zoo")
    for p in (REPO / folder).glob("*.py")
    if not p.name.startswith("_")
)
PATTERN_KEYS = (
    "rule",
    "family",
    "signature",
    "nodes",
    "anchors",
    "output",
    "operands",
    "epilogue",
    "epilogue_expr",
    "problem",
    "attrs",
    "search_space",
)


def snapshot(plan: dict) -> dict:
    """What a plan decides, without estimates or registry rows."""
    return {
        "patterns": [{k: p[k] for k in PATTERN_KEYS if k in p} for p in plan["patterns"]],
        "pytorch_nodes": plan["pytorch_nodes"],
        "opaque_nodes": plan["opaque_nodes"],
        "free_nodes": [n["name"] for n in plan["free_nodes"]],
        "rule_hits": plan.get("rule_hits"),
    }


def golden_path(source: Path) -> Path:
    return GOLDEN / source.parent.name / f"{source.stem}.json"


def test_every_shipped_module_has_a_snapshot_and_no_snapshot_is_orphaned():
    if os.environ.get("FACT_UPDATE_GOLDEN"):
        pytest.skip("writing snapshots")
    expected = {golden_path(s) for s in SOURCES}
    present = set(GOLDEN.glob("*/*.json"))
    assert expected - present == set(), "run with FACT_UPDATE_GOLDEN=1 to write them"
    assert present - expected == set(), "snapshots of modules that are gone: delete them"


@pytest.mark.parametrize("source", SOURCES, ids=[str(s) for s in SOURCES])
def test_plan_matches_its_snapshot(engine_available, tmp_path, monkeypatch, source):
    from fact.cli import _trace_problem
    from fact.engine import engine_json

    monkeypatch.setenv("FACT_REGISTRY", str(tmp_path / "empty-registry.db"))
    graph = tmp_path / "graph.json"
    _trace_problem(str(REPO / source), "bf16", graph, precision="high", arch="sm90")
    got = snapshot(engine_json("discover", graph, "--arch", "sm90", "--gpu", "h100"))
    path = golden_path(source)
    if os.environ.get("FACT_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        return
    assert path.exists(), f"no snapshot for {source}: run with FACT_UPDATE_GOLDEN=1"
    want = json.loads(path.read_text())
    for i, (a, b) in enumerate(zip(got["patterns"], want["patterns"], strict=False)):
        assert a == b, f"{source}: pattern {i} ({b.get('signature')}) differs from its snapshot"
    assert got == want, f"{source}: the plan differs from {path.relative_to(REPO)}"
