"""LayerNorms folded into the GEMMs that read them: a rewrite of an exported graph before it is
planned, so that no kernel writes the normalised activations.

A pre-norm transformer normalises x and multiplies the result by weights at once:

    y = layer_norm(x, [K], g, beta, eps)       (B, S, K), written and read back
    o_i = linear(y, W_i, b_i)                  for each projection reading it

With mean and rstd per row of x, and per output column of W_i,

    o_i = rstd * (x @ (W_i * g)^T - mean * c1_i) + c2_i
    c1_i = sum_k (W_i * g)[:, k]  (f32)        c2_i = W_i @ beta + b_i  (f32)

So the graph becomes one statistics pass over x (native_layer_norm's mean and rstd of x in f32,
a generated kernel that reads x once and writes two columns) and, per projection, a GEMM of x
itself whose epilogue applies the row statistics and the column sums. The derived weights
W_i * g, c1_i and c2_i depend on parameters alone: the composed module computes them once, and
again when a parameter changes (compose/hoist.py), and the planner proposes no kernel for them.
For MiniGPT's two LayerNorms that replaces two passes that read and write the activations
(2 x 100 MB each in bf16) by two that only read them.

Numerics: the products are x times W_i * g rounded to the model's dtype once (the model rounds
the normalised activations instead); the GEMM accumulates in f32 and the epilogue subtracts
mean * c1 from that f32 accumulator, so the result matches the unfused model to the precision's
tolerance unless a row's mean dwarfs its spread.

A fold only pays when its kernels run: `fact.optimize` checks after choosing that the statistics
and every folded GEMM (with its whole epilogue) run as FACT kernels, and plans the module again
without the folds that fail (`kept`).

Measured (bench/README.md, "the LayerNorm folds measured"; H200, MiniGPT block, cold caches):
the folds do not pay there, so they are off by default (`fact.optimize(fold_norms=True)`,
`--fold-norms`).
In bf16 the statistics kernel took 0.045 ms against the LayerNorm's 0.053 (its one 32-thread
block per row reads 100 MB at 2.2 TB/s), and the folded GEMMs' heavier epilogues cost more than
that (0.490 against 0.464 ms with GELU, 0.344 against 0.331): the block ran 1.815 ms folded,
1.797 not. In fp32 `highest` (3xTF32 GEMMs) the statistics ran at 3.6 TB/s and the folded block
tied (15.19 against 15.28 ms) with twice the error (4.9e-7 against 2.4e-7, eager 3.8e-7).

Costs: the folded weights W_i * g are kept beside the model's (the report says how many bytes);
under torch.compile of the optimized module, or fake tensors, the derived weights are computed
every call (only the eager path hoists them).
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch
from torch import fx
from torch.export.graph_signature import InputKind

from fact.fx_build import NodeBuilder, arg_of, fake_mode_of, take_name, value_of

aten = torch.ops.aten

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def applies(dtype: torch.dtype, precision: str, arch: str) -> bool:
    """Whether LayerNorms are folded for a `dtype` model under `precision` on `arch`: bf16 and
    fp16 models on sm90 and sm80, fp32 models only under `highest` (fp32-accurate GEMMs).

    The fold multiplies x itself, not x - mean: a 16-bit x is exact in the GEMM and the rounding
    of W * g cancels against c1 (computed from the rounded weights), so the error scales with
    the rows' spread as the model's does. TF32 rounds x inside the tensor cores, an error that
    scales with |x| and that mean * c1 does not cancel: on rows whose mean is large against
    their spread it would exceed `high`'s bound."""
    if arch not in ("sm90", "sm80") or dtype not in _DTYPES:
        return False
    return dtype != torch.float32 or precision == "highest"


def _state_names(program: torch.export.ExportedProgram) -> set[str]:
    """Placeholders holding parameters and buffers: what the derived weights may be made of."""
    kinds = (InputKind.PARAMETER, InputKind.BUFFER)
    return {s.arg.name for s in program.graph_signature.input_specs if s.kind in kinds}


def _state(node: Any, state: set[str]) -> bool:
    return isinstance(node, fx.Node) and node.op == "placeholder" and node.name in state


def _match(ln: fx.Node, state: set[str], outputs: set[fx.Node]) -> dict[str, Any] | None:
    """The LayerNorm `ln` and the linears reading it, when every reader is a foldable linear."""
    if ln.target is not aten.layer_norm.default or ln in outputs or not ln.users:
        return None
    x, shape = ln.args[0], arg_of(ln, 1, "normalized_shape")
    gamma, beta = arg_of(ln, 2, "weight"), arg_of(ln, 3, "bias")
    eps = float(arg_of(ln, 4, "eps", 1e-5))
    xv = value_of(x)
    if not isinstance(xv, torch.Tensor) or xv.dtype not in _DTYPES or xv.dim() < 2:
        return None
    k = xv.shape[-1]
    if not isinstance(k, int) or list(shape) != [k]:
        return None
    for p in (gamma, beta):
        if p is not None and not (_state(p, state) and value_of(p).dtype == xv.dtype):
            return None
    linears = []
    for user in ln.users:
        if user.target is not aten.linear.default or user.args[0] is not ln or user.kwargs:
            return None
        w = user.args[1]
        b = user.args[2] if len(user.args) > 2 else None
        if not _state(w, state) or (b is not None and not _state(b, state)):
            return None
        wv = value_of(w)
        if wv.dim() != 2 or wv.shape[1] != k or wv.dtype != xv.dtype:
            return None
        linears.append((user, w, b))
    return {"ln": ln, "x": x, "gamma": gamma, "beta": beta, "eps": eps, "linears": linears}


def _fold(gm: fx.GraphModule, m: dict[str, Any], fake_mode: Any) -> dict[str, Any]:
    g = gm.graph
    # x read now, not at match time: an earlier fold may have replaced the node that made it
    # (a LayerNorm of a folded linear's output)
    x, gamma, beta, eps = m["ln"].args[0], m["gamma"], m["beta"], m["eps"]
    dtype = value_of(x).dtype
    k = value_of(x).shape[-1]
    add = NodeBuilder(g, m["ln"], fake_mode)
    f32 = torch.float32

    def to_f32(node: fx.Node) -> fx.Node:
        return node if value_of(node).dtype == f32 else add(aten._to_copy.default, node, dtype=f32)

    xf = to_f32(x)
    stats = add(aten.native_layer_norm.default, xf, [k], None, None, eps)
    mean = add(operator.getitem, stats, 1)
    rstd = add(operator.getitem, stats, 2)
    record: dict[str, Any] = {"norm": m["ln"].name, "gemms": [], "weight_bytes": 0}
    for linear, w, b in m["linears"]:
        add.source(linear)
        wg = add(aten.mul.Tensor, w, gamma) if gamma is not None else w
        c1 = add(aten.sum.dim_IntList, wg, [1], False, dtype=f32)
        c2 = add(aten.mv.default, to_f32(w), to_f32(beta)) if beta is not None else None
        if b is not None:
            c2 = to_f32(b) if c2 is None else add(aten.add.Tensor, c2, to_f32(b))
        acc = add(aten.linear.default, x, wg)
        out = add(aten.mul.Tensor, add(aten.sub.Tensor, acc, add(aten.mul.Tensor, mean, c1)), rstd)
        if c2 is not None:
            out = add(aten.add.Tensor, out, c2)
        if dtype != f32:
            out = add(aten._to_copy.default, out, dtype=dtype)
        linear.replace_all_uses_with(out)
        name = linear.name
        g.erase_node(linear)
        take_name(acc, name)  # the GEMM keeps the linear's name
        record["gemms"].append({"linear": name, "gemm": acc.name, "output": out.name})
        wv = value_of(wg)
        record["weight_bytes"] += wv.numel() * wv.element_size() if gamma is not None else 0
    g.erase_node(m["ln"])
    take_name(stats, record["norm"])  # the statistics keep the norm's name
    record["stats"] = [n.name for n in (xf, stats, mean, rstd) if n is not x]
    return record


def fold_norms(
    program: torch.export.ExportedProgram, skip: Collection[str] = ()
) -> list[dict[str, Any]]:
    """Fold, in place, every LayerNorm whose readers are all linears over parameters into those
    linears (see the module docstring), except the norms named in `skip`. Returns a record per
    fold: the norm, the statistics' nodes, per linear the GEMM node and the node that now
    stands for its output, and the bytes of the folded weights kept beside the model's."""
    gm = program.graph_module
    state = _state_names(program)
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outputs = {a for a in out_node.all_input_nodes}
    found = [
        m
        for n in list(gm.graph.nodes)
        if n.name not in skip and (m := _match(n, state, outputs)) is not None
    ]
    if not found:
        return []
    fake_mode = fake_mode_of(gm)
    if fake_mode is None:
        return []
    records = [_fold(gm, m, fake_mode) for m in found]
    gm.graph.lint()
    gm.recompile()
    return records


def describe(record: Mapping[str, Any]) -> str:
    """One line for the progress display and the report."""
    gemms = ", ".join(g["linear"] for g in record["gemms"])
    kept = record.get("weight_bytes", 0)
    size = f"{kept / 2**20:.1f} MiB" if kept >= 2**20 else f"{kept / 2**10:.0f} KiB"
    return (
        f"{record['norm']} folded into {gemms} (row statistics of the input; {size} of "
        "weights * gamma kept beside the model's)"
    )


def kept(
    records: Sequence[Mapping[str, Any]], plan: Mapping[str, Any], decisions
) -> dict[str, str]:
    """The folds that do not pay, by norm, with why (empty when they all do): a fold pays when
    its statistics run as a FACT kernel and each folded GEMM, with its whole epilogue up to the
    node that stands for the linear's output, does too. (That is its kernels against the folded
    graph in PyTorch; against the norm and GEMM as written, `fact bench` with and without
    --fold-norms says.)"""
    patterns = plan.get("patterns") or []
    replaced = {
        int(d["index"])
        for d in decisions
        if d.get("impl") is not None and not d.get("fallback") and d.get("chosen") != "pytorch"
    }
    covering: dict[str, int] = {}
    for i, p in enumerate(patterns):
        for name in p.get("nodes") or []:
            covering[str(name)] = i
    problems: dict[str, str] = {}
    for r in records:
        why = []
        if any(covering.get(name) not in replaced for name in r["stats"]):
            why.append("its row statistics run in PyTorch")
        for gemm in r["gemms"]:
            i = covering.get(gemm["gemm"])
            if i is None or i not in replaced or covering.get(gemm["output"]) != i:
                why.append(
                    f"the folded GEMM for {gemm['linear']} does not run as one FACT kernel with "
                    "its epilogue"
                )
        if why:
            problems[r["norm"]] = "; ".join(why)
    return problems
