"""The rewrites an exported program gets before it is planned, for a target: `einsums` (each
two-operand einsum as torch's own decomposition of it), fact.layouts (a producer writes the
layout its consumer's kernels read) and fact.folds (LayerNorms folded into the GEMMs after
them). `fact.optimize` and the CLI's discover, explain and realize of a problem file apply the
same ones, so both plan the same graph."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch
from torch import fx

from fact import folds, layouts
from fact.fx_build import NodeBuilder, fake_mode_of, take_name, value_of

_EINSUM = torch.ops.aten.einsum.default


def apply(
    program: torch.export.ExportedProgram,
    dtype: torch.dtype,
    precision: str,
    arch: str,
    *,
    fold_norms: bool = False,
    fold_skip: Collection[str] = (),
) -> tuple[list[str], list[dict[str, Any]]]:
    """Rewrite `program` in place for a `dtype` model under `precision` on `arch` (with
    LayerNorm folds only when `fold_norms`, and none of the norms in `fold_skip`). Returns a
    line per rewrite ("layout: ...", "fold: ..."), and the folds' records (folds.fold_norms)
    for the check that they pay."""
    lines = [f"einsum: {line}" for line in einsums(program)]
    lines += [f"layout: {line}" for line in layouts.rewrite(program, dtype, precision, arch)]
    records: list[dict[str, Any]] = []
    if fold_norms and folds.applies(dtype, precision, arch):
        records = folds.fold_norms(program, skip=fold_skip)
        lines += [f"fold: {folds.describe(r)}" for r in records]
    return lines, records


def einsums(program: torch.export.ExportedProgram) -> list[str]:
    """Rewrite, in place, each two-operand einsum as torch's own decomposition of it (the ops its
    CompositeImplicit kernel runs: unsqueezes, permutes and views around one bmm), so that the
    GEMM rules see the contraction and the pointwise work after it; the engine knows no einsum.
    The values are those einsum computes, op for op. Returns a line per rewrite."""
    gm = program.graph_module
    found = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is _EINSUM]
    fake_mode = fake_mode_of(gm) if found else None
    if fake_mode is None:
        return []
    from torch.fx.experimental.proxy_tensor import make_fx

    done = []
    for node in found:
        equation, operands = node.args[0], list(node.args[1])
        values = [value_of(o) for o in operands]
        if len(operands) != 2 or node.kwargs.get("path") or len(node.args) > 2:
            continue  # a chain of contractions (or a given path) stays one opaque op
        if any(isinstance(d, torch.SymInt) for v in values for d in v.shape):
            continue  # the decomposition's views would fix symbolic sizes
        with fake_mode:
            sub = make_fx(_contraction(equation))(*values)
        add = NodeBuilder(gm.graph, node, fake_mode)
        env: dict[fx.Node, Any] = {}
        inputs = iter(operands)
        for step in sub.graph.nodes:
            if step.op == "placeholder":
                env[step] = next(inputs)
            elif step.op == "call_function":
                args, kwargs = fx.map_arg((step.args, step.kwargs), env.__getitem__)
                env[step] = add(step.target, *args, **kwargs)
            elif step.op == "output":
                result = fx.map_arg(step.args[0], env.__getitem__)
        node.replace_all_uses_with(result)
        name = node.name
        gm.graph.erase_node(node)
        take_name(result, name)
        done.append(f"{name} ({equation!r}) as {_described(sub.graph)}")
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _contraction(equation: str) -> Any:
    """einsum of `equation` over two operands, by its CompositeImplicit kernel."""
    return lambda a, b: _EINSUM.decompose(equation, [a, b])


def _described(graph: fx.Graph) -> str:
    """The ops of a decomposition, counted: "3 permute, 2 view, 1 bmm"."""
    counts: dict[str, int] = {}
    for n in graph.nodes:
        if n.op == "call_function":
            op = getattr(n.target, "__name__", str(n.target)).split(".")[0]
            counts[op] = counts.get(op, 0) + 1
    return ", ".join(f"{c} {op}" for op, c in counts.items())
