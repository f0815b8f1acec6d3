"""The rewrites an exported program gets before it is planned, for a target: `einsums` (each
two-operand einsum as torch's own decomposition of it), `gate_up_splits` (a fused gate and up
projection split in two, as a gated MLP), fact.layouts (a producer writes the layout its
consumer's kernels read) and fact.folds (LayerNorms folded into the GEMMs after them).
`fact.optimize` and the CLI's discover, explain and realize of a problem file apply the same
ones, so both plan the same graph."""

from __future__ import annotations

import operator
from collections.abc import Collection
from typing import Any

import torch
from torch import fx

from fact import folds, layouts
from fact.fx_build import NodeBuilder, fake_mode_of, take_name, value_of

aten = torch.ops.aten
_EINSUM = aten.einsum.default
# The activations of a gated MLP that the gated rule and its kernels know (engine: gated_mlp).
_GATE_ACTIVATIONS = {aten.silu.default, aten.gelu.default, aten.relu.default}


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
    lines += [f"gated MLP: {line}" for line in gate_up_splits(program)]
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


def gate_up_splits(program: torch.export.ExportedProgram) -> list[str]:
    """Rewrite, in place, a fused gate and up projection (one linear over [W_gate; W_up] whose
    output is cut in two halves along the last dim, by chunk, split or slices, and then
    act(gate) * up, as Phi-3's gate_up_proj) as two linears over the halves of the weight (and
    of the bias), views of the same parameter: the gated MLP the gated rule plans as one gate
    GEMM whose epilogue multiplies in the up half, instead of a GEMM writing both halves and a
    pointwise pass reading them back. Returns a line per rewrite."""
    gm = program.graph_module
    found = [m for n in gm.graph.nodes if (m := _fused_gate_up(n)) is not None]
    fake_mode = fake_mode_of(gm) if found else None
    if fake_mode is None:
        return []
    done = []
    for linear, parts, gate in found:
        x, w = linear.args[0], linear.args[1]
        bias = linear.args[2] if len(linear.args) > 2 else linear.kwargs.get("bias")
        half = value_of(w).shape[0] // 2
        add = NodeBuilder(gm.graph, linear, fake_mode)
        made = []
        for i in (gate, 1 - gate):
            rows = (i * half, (i + 1) * half)
            args = [x, add(aten.slice.Tensor, w, 0, *rows)]
            if bias is not None:
                args.append(add(aten.slice.Tensor, bias, 0, *rows))
            made.append(add(aten.linear.default, *args))
            parts[i].replace_all_uses_with(made[-1])
        cut = parts[0].args[0]  # the chunk or split the halves are items of, or the linear
        for node in parts:
            gm.graph.erase_node(node)
        if cut is not linear:
            gm.graph.erase_node(cut)
        gm.graph.erase_node(linear)
        take_name(made[0], linear.name)
        done.append(
            f"{linear.name} ({value_of(w).shape[0]} x {value_of(w).shape[1]}) as a gate and an "
            f"up linear over rows 0..{half} and {half}..{2 * half} of {w.name}"
            + ("" if gate == 0 else " (the gate is the second half)")
        )
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _fused_gate_up(linear: fx.Node) -> tuple[fx.Node, list[fx.Node], int] | None:
    """(linear, [first half, second half], which half is the gate) where `linear`'s output is
    used only cut in two halves along its last dim that meet in act(gate) * up."""
    if linear.op != "call_function" or linear.target is not aten.linear.default:
        return None
    out = value_of(linear)
    if not isinstance(out, torch.Tensor) or out.dim() < 2 or out.shape[-1] % 2:
        return None
    half, last = out.shape[-1] // 2, out.dim() - 1
    parts = _halves(linear, half, last)
    if parts is None:
        return None
    for gate in (0, 1):
        acts = list(parts[gate].users)
        ups = list(parts[1 - gate].users)
        if len(acts) != 1 or len(ups) != 1 or acts[0].target not in _GATE_ACTIVATIONS:
            continue
        (mul,) = ups
        if (
            mul.target is aten.mul.Tensor
            and list(acts[0].users) == [mul]
            and {a for a in mul.args if isinstance(a, fx.Node)} == {acts[0], parts[1 - gate]}
        ):
            return linear, parts, gate
    return None


def _halves(linear: fx.Node, half: int, last: int) -> list[fx.Node] | None:
    """The two nodes that are `linear`'s output's halves along dim `last` and its only uses:
    getitems of a chunk(2) or split(half) (or split_with_sizes [half, half]), or two slices."""
    users = list(linear.users)

    def dim_ok(d: Any) -> bool:
        return d in (-1, last)

    if len(users) == 1:
        (cut,) = users
        args = list(cut.args) + [None] * 3
        if cut.target is aten.chunk.default:
            ok = args[1] == 2 and dim_ok(args[2] if args[2] is not None else 0)
        elif cut.target is aten.split.Tensor:
            ok = args[1] == half and dim_ok(args[2] if args[2] is not None else 0)
        elif cut.target is aten.split_with_sizes.default:
            ok = list(args[1]) == [half, half] and dim_ok(args[2] if args[2] is not None else 0)
        else:
            return None
        items = {u.args[1]: u for u in cut.users if u.target is operator.getitem}
        if not ok or len(cut.users) != 2 or sorted(items) != [0, 1]:
            return None
        return [items[0], items[1]]
    if len(users) != 2 or any(u.target is not aten.slice.Tensor for u in users):
        return None
    bounds = {}
    for u in users:
        args = list(u.args) + [None] * 4
        start, end = args[2] or 0, args[3] if args[3] is not None else 2 * half
        if not dim_ok(args[1] if args[1] is not None else 0) or (args[4] or 1) != 1:
            return None
        bounds[(start, min(end, 2 * half))] = u
    if set(bounds) != {(0, half), (half, 2 * half)}:
        return None
    return [bounds[(0, half)], bounds[(half, 2 * half)]]
