"""Small helpers for reading graphs in tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
# Each kernel family's C ABI header lives in its engine folder; the others include the GEMM one.
ABI_DIRS = [REPO / "engine" / "families" / f for f in ("gemm", "attention", "norm", "pointwise")]


def abi_header(name: str) -> Path:
    """The path of ABI header `name` (fact_gemm_abi.h, ...)."""
    return next(d / name for d in ABI_DIRS if (d / name).exists())


def node_named(graph: dict, name: str) -> dict:
    """The graph node called name (fails the test if there is none)."""
    for node in graph["nodes"]:
        if node["name"] == name:
            return node
    raise AssertionError(f"no node {name!r} in the graph")


def nodes_with_op(graph: dict, op: str) -> list[dict]:
    return [n for n in graph["nodes"] if n["op"] == op]


def node_refs(value: Any) -> Iterator[str]:
    """Every node name an encoded argument value refers to."""
    if isinstance(value, dict):
        if "node" in value:
            yield value["node"]
    elif isinstance(value, list):
        for item in value:
            yield from node_refs(item)
