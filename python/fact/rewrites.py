"""The rewrites an exported program gets before it is planned, for a target: fact.masks (an
attention mask made of constants becomes is_causal or no mask), `shape_refs` (x.view_as(y),
reshape_as and expand_as as the view of y's static size they are), `einsums` (each
two-operand einsum as the linear or matmul over views it is), `gate_up_splits` (a fused gate
and up projection split in two, as a gated MLP), fact.layouts (a producer writes the layout its
consumer's kernels read) and fact.folds (LayerNorms folded into the GEMMs after them).
`fact.optimize` and the CLI's discover, explain and realize of a problem file apply the same
ones, so both plan the same graph."""

from __future__ import annotations

import math
import operator
from collections.abc import Collection
from typing import Any

import torch
from torch import fx

from fact import folds, layouts, masks
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
    lines = [f"mask: {line}" for line in masks.rewrite(program)]
    lines += [f"view: {line}" for line in shape_refs(program)]
    lines += [f"einsum: {line}" for line in einsums(program)]
    lines += [f"gated MLP: {line}" for line in gate_up_splits(program)]
    lines += [f"layout: {line}" for line in layouts.rewrite(program, dtype, precision, arch)]
    records: list[dict[str, Any]] = []
    if fold_norms and folds.applies(dtype, precision, arch):
        records = folds.fold_norms(program, skip=fold_skip)
        lines += [f"fold: {folds.describe(r)}" for r in records]
    return lines, records


# x.view_as(y) is x.view(y.size()): y is only a shape. Read as an operand it would keep y's
# producer alive (a GEMM whose bias add is expand_as'ed against its own output could take no
# epilogue), so where y's size is static the size is written in instead.
_SIZE_OF = {
    aten.view_as.default: aten.view.default,
    aten.reshape_as.default: aten.reshape.default,
    aten.expand_as.default: aten.expand.default,
}


def shape_refs(program: torch.export.ExportedProgram) -> list[str]:
    """Rewrite, in place, each view_as, reshape_as and expand_as whose reference has a static
    size as view, reshape or expand to that size. Returns a line per rewrite."""
    gm = program.graph_module
    done = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _SIZE_OF or len(node.args) != 2:
            continue
        ref = node.args[1]
        val = ref.meta.get("val") if isinstance(ref, fx.Node) else None
        if not isinstance(val, torch.Tensor) or not all(isinstance(d, int) for d in val.shape):
            continue  # a symbolic size stays a reference
        old, new = (str(t).split(".")[-2] for t in (node.target, _SIZE_OF[node.target]))
        node.target = _SIZE_OF[node.target]
        node.args = (node.args[0], list(val.shape))
        done.append(f"{node.name} ({old} of {ref.name}) as {new} {list(val.shape)}")
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def einsums(program: torch.export.ExportedProgram) -> list[str]:
    """Rewrite, in place, each two-operand einsum as torch.matmul over permuted views of its
    operands (batch dims kept apart, as hand-written attention's q @ k.transpose(-2, -1)), or
    as F.linear where it has no batch dims (a projection), so that the GEMM and attention
    rules see the contraction and the work after it; the engine knows no einsum. Where the
    equation is no such product (a diagonal, a dim summed within one operand, an outer
    product), torch's own decomposition of it (the ops its CompositeImplicit kernel runs)
    takes its place. Returns a line per rewrite."""
    gm = program.graph_module
    found = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is _EINSUM]
    fake_mode = fake_mode_of(gm) if found else None
    if fake_mode is None:
        return []
    done = []
    for node in found:
        equation, operands = node.args[0], list(node.args[1])
        values = [value_of(o) for o in operands]
        if len(operands) != 2 or node.kwargs.get("path") or len(node.args) > 2:
            continue  # a chain of contractions (or a given path) stays one opaque op
        if any(isinstance(d, torch.SymInt) for v in values for d in v.shape):
            continue  # the rewrite's views would fix symbolic sizes
        add = NodeBuilder(gm.graph, node, fake_mode)
        form = matmul_form(equation, [tuple(v.shape) for v in values])
        if form is not None:
            result = _emit_matmul(add, operands, form)
            how = "linear" if not form["batch"] else "matmul"
            how += " over views of its operands"
        else:
            result, how = _emit_decomposed(add, operands, equation, values, fake_mode)
        node.replace_all_uses_with(result)
        name = node.name
        gm.graph.erase_node(node)
        take_name(result, name)
        done.append(f"{name} ({equation!r}) as {how}")
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def matmul_form(equation: str, shapes: list[tuple[int, ...]]) -> dict[str, Any] | None:
    """How a two-operand einsum is one matmul: {"a": A's permutation to (batch, m, k), "b": B's
    to (batch, k, n), "batch"/"m"/"n"/"k": the dims' sizes, "out": the permutation from
    (batch, m, n) to the equation's output}; None where it is not (a letter repeated in one
    term, summed within one operand, an outer product, ellipsis dims that broadcast)."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != 2 or len(shapes) != 2:
        return None
    used = {c for c in eq if c.isalpha()}
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in used]
    ellipsis_rank = 0
    for term, shape in zip(terms, shapes, strict=True):
        if "..." in term:
            ellipsis_rank = max(ellipsis_rank, len(shape) - len(term.replace("...", "")))
    ell = spare[:ellipsis_rank]
    expanded = []
    for term, shape in zip(terms, shapes, strict=True):
        if "..." in term:
            own = len(shape) - len(term.replace("...", ""))
            term = term.replace("...", "".join(ell[ellipsis_rank - own :]))
        if len(term) != len(shape) or len(set(term)) != len(term):
            return None
        expanded.append(term)
    a, b = expanded
    if not arrow:  # implicit output: the letters seen once, in order, after the ellipsis
        once = sorted(c for c in set(a + b) if (a + b).count(c) == 1 and c not in ell)
        out = "".join(ell) + "".join(once)
    out = out.replace("...", "".join(ell))
    if len(set(out)) != len(out) or any(c not in a + b for c in out):
        return None
    size = {}
    for term, shape in zip(expanded, shapes, strict=True):
        for c, d in zip(term, shape, strict=True):
            if size.setdefault(c, d) != d:
                return None  # broadcasting dims (1 against n) are einsum's to handle
    batch = [c for c in out if c in a and c in b]
    m = [c for c in out if c in a and c not in b]
    n = [c for c in out if c in b and c not in a]
    k = [c for c in a if c in b and c not in out]
    if not k or len(batch) + len(m) + len(k) != len(a) or len(batch) + len(k) + len(n) != len(b):
        return None  # an outer product, or a dim summed within one operand
    order = batch + m + n
    return {
        "a": [a.index(c) for c in batch + m + k],
        "b": [b.index(c) for c in batch + k + n],
        "batch": [size[c] for c in batch],
        "m": [size[c] for c in m],
        "n": [size[c] for c in n],
        "k": [size[c] for c in k],
        "out": [order.index(c) for c in out],
    }


def _emit_matmul(add: NodeBuilder, operands: list[fx.Node], form: dict[str, Any]) -> fx.Node:
    """torch.matmul(A', B') for a `matmul_form`: A' is (batch, m..., K), B' (batch, 1..., K, N)
    (a 1 for each m dim but the last, so that they broadcast), K and N each one dim; the result
    is cut back into the n dims and permuted to the equation's output."""

    def permuted(node: fx.Node, perm: list[int]) -> fx.Node:
        """The view as hand-written code makes it: a transpose where two dims swap."""
        moved = [i for i, p in enumerate(perm) if p != i]
        if not moved:
            return node
        if len(moved) == 2:
            return add(aten.transpose.int, node, *moved)
        return add(aten.permute.default, node, perm)

    def reshaped(node: fx.Node, shape: list[int]) -> fx.Node:
        return (
            node if list(value_of(node).shape) == shape else add(aten.reshape.default, node, shape)
        )

    k = math.prod(form["k"])
    n = math.prod(form["n"])
    nb, nk = len(form["batch"]), len(form["k"])  # B's dims, in B's order: batch, k, n
    b_batch, b_k, b_n = form["b"][:nb], form["b"][nb : nb + nk], form["b"][nb + nk :]
    if not form["batch"]:  # a projection: linear(A' (m..., K), B' (N, K)), as nn.Linear
        lhs = reshaped(permuted(operands[0], form["a"]), [*(form["m"] or [1]), k])
        weight = reshaped(permuted(operands[1], b_n + b_k), [n, k])
        product = reshaped(add(aten.linear.default, lhs, weight), [*form["m"], *form["n"]])
        return permuted(product, form["out"])
    m = form["m"] or [1]
    lhs = reshaped(permuted(operands[0], form["a"]), [*form["batch"], *m, k])
    if b_n and b_k and min(b_n) < min(b_k):  # B holds n before k (attention's K): (.., n, k)^T
        rhs = reshaped(permuted(operands[1], b_batch + b_n + b_k), [*form["batch"], n, k])
        rhs = add(aten.transpose.int, rhs, -2, -1)
    else:
        rhs = reshaped(permuted(operands[1], form["b"]), [*form["batch"], k, n])
    if len(m) > 1:  # the m dims but the last broadcast against B
        rhs = reshaped(rhs, [*form["batch"], *([1] * (len(m) - 1)), k, n])
    product = add(aten.matmul.default, lhs, rhs)
    product = reshaped(product, [*form["batch"], *form["m"], *form["n"]])
    return permuted(product, form["out"])


def _emit_decomposed(
    add: NodeBuilder, operands: list[fx.Node], equation: str, values: list[Any], fake_mode: Any
) -> tuple[fx.Node, str]:
    """torch's own decomposition of a two-operand einsum (its CompositeImplicit kernel's ops)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with fake_mode:
        sub = make_fx(_contraction(equation))(*values)
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
    return result, _described(sub.graph)


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
    for linear, bias_add, parts, gate in found:
        x, w = linear.args[0], linear.args[1]
        bias = linear.args[2] if len(linear.args) > 2 else linear.kwargs.get("bias")
        if bias_add is not None:
            bias = next(a for a in bias_add.args if a is not linear)
        half = value_of(w).shape[0] // 2
        # after the bias add where there is one: its vector may be made after the linear
        add = NodeBuilder(gm.graph, bias_add if bias_add is not None else linear, fake_mode)
        made = []
        for i in (gate, 1 - gate):
            rows = (i * half, (i + 1) * half)
            args = [x, add(aten.slice.Tensor, w, 0, *rows)]
            if bias is not None:
                args.append(add(aten.slice.Tensor, bias, 0, *rows))
            made.append(add(aten.linear.default, *args))
            parts[i].replace_all_uses_with(made[-1])
        cut = parts[0].args[0]  # the chunk or split the halves are items of, or the output
        for node in parts:
            gm.graph.erase_node(node)
        for node in dict.fromkeys(n for n in (cut, bias_add, linear) if n is not None):
            gm.graph.erase_node(node)  # the cut, the bias add, the linear: each unused now
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


def _fused_gate_up(
    linear: fx.Node,
) -> tuple[fx.Node, fx.Node | None, list[fx.Node], int] | None:
    """(linear, the add of a bias vector after it or None, [first half, second half], which
    half is the gate) where `linear`'s output (plus a bias, for a bias-free linear) is used only
    cut in two halves along its last dim that meet in act(gate) * up."""
    if linear.op != "call_function" or linear.target is not aten.linear.default:
        return None
    out, weight = value_of(linear), value_of(linear.args[1])
    if not isinstance(out, torch.Tensor) or out.dim() < 2 or out.shape[-1] % 2:
        return None
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return None  # a 1-D weight (a dot product per row) has no rows to cut
    half, last = out.shape[-1] // 2, out.dim() - 1
    cut_from, bias_add = linear, _bias_add(linear)
    if bias_add is not None:
        cut_from = bias_add
    parts = _halves(cut_from, half, last)
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
            return linear, bias_add, parts, gate
    return None


def _bias_add(linear: fx.Node) -> fx.Node | None:
    """The only use of a bias-free `linear`, where it adds a vector of its width (a bias written
    out: linear(x, w) + b), else None."""
    users = list(linear.users)
    has_bias = len(linear.args) > 2 and linear.args[2] is not None
    if has_bias or linear.kwargs.get("bias") is not None or len(users) != 1:
        return None
    (add,) = users
    if add.target is not aten.add.Tensor or len(add.args) != 2 or add.kwargs.get("alpha", 1) != 1:
        return None
    other = next((a for a in add.args if a is not linear), None)
    vec, out = value_of(other), value_of(linear)
    if not isinstance(vec, torch.Tensor) or tuple(vec.shape) != (out.shape[-1],):
        return None
    if vec.dtype != out.dtype:  # the add promotes (bf16 + f32 is f32): not the linear's bias
        return None
    return add


def _halves(node: fx.Node, half: int, last: int) -> list[fx.Node] | None:
    """The two nodes that are `node`'s output's halves along dim `last` and its only uses:
    getitems of a chunk(2) or split(half) (or split_with_sizes [half, half]), or two slices
    or narrows."""
    users = list(node.users)

    def dim_ok(d: Any) -> bool:
        return d in (-1, last)

    if len(users) == 1:
        (cut,) = users
        args = list(cut.args) + [None] * 3
        if not dim_ok(args[2] if args[2] is not None else 0):  # chunk's and split's dim
            return None
        if cut.target is aten.chunk.default:
            ok = args[1] == 2
        elif cut.target is aten.split.Tensor:
            ok = args[1] == half
        elif cut.target is aten.split_with_sizes.default:
            ok = list(args[1]) == [half, half]
        else:
            return None
        items = {u.args[1]: u for u in cut.users if u.target is operator.getitem}
        if not ok or len(cut.users) != 2 or sorted(items) != [0, 1]:
            return None
        return [items[0], items[1]]
    if len(users) != 2:
        return None
    width, bounds = 2 * half, {}
    for u in users:  # slices (negative bounds as Python reads them) or narrows of the last dim
        args = list(u.args) + [None] * 4
        if u.target is aten.slice.Tensor and (args[4] or 1) == 1:
            start, end = args[2] or 0, args[3] if args[3] is not None else width
        elif u.target is aten.narrow.default:
            start, end = args[2], args[2] + args[3] if isinstance(args[2], int) else None
        else:
            return None
        if not (isinstance(start, int) and isinstance(end, int)):
            return None
        start, end = (i + width if i < 0 else i for i in (start, end))
        if not dim_ok(args[1] if args[1] is not None else 0):
            return None
        bounds[(start, min(end, width))] = u
    if set(bounds) != {(0, half), (half, width)}:
        return None
    return [bounds[(0, half)], bounds[(half, width)]]
