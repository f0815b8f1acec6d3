"""Layout rewrites of an exported graph, before it is planned: a producer writes the layout its
consumer's kernels read, so that no kernel has to copy between them.

`rewrite` applies those that pay off for a target. Two so far:

- `attention_inputs_in_place` (every target): scaled_dot_product_attention reads Q, K and V as
  views of the tensors they were cut from where the graph copied them on the way (see its
  docstring; the layout algebra is `chain_layout` and `view_ops`).
- `v_transposed`, under TF32 on Hopper: attention's V is produced transposed.

Hopper's TF32 WGMMAs read shared memory K-major only, so FACT's TF32 attention kernels
transpose V (batch, seq, heads, dim) into (dim, keys) before P @ V (117 us of 466 at the
MiniGPT shape), unless V arrives with its keys contiguous, which they read in place (attention
ABI version 4, `v_stride_d`). A projection can write V that way at no extra cost:
V^T = W_v x^T + b_v is a GEMM with M = heads * dim and N = batch * seq whose row-major output
holds every (batch, head)'s V^T with the keys contiguous, and its bias is a column vector in
the epilogue. So where V is

    v = linear(x, W, b)                       (a V projection)
    v = split(linear(x, W, b), C, -1)[last]   (the last part of a fused QKV projection)
    -> view(B, S, H, D) -> transpose(1, 2) -> V of attention's P @ V (written out; see
       _attention_v for why not SDPA's)

the graph becomes

    vt = addmm(b_v[:, None], W_v, x.view(B * S, K).t())     (H * D, B * S)
    v = vt.view(H, D, B, S).permute(2, 0, 3, 1)             (B, H, S, D), keys contiguous

with W_v, b_v views (slices) of the model's own parameters, and a fused projection's other
parts computed by one linear over the rest of its weight. The function is the same; only the
layout of V (and the summation order inside V's GEMM) changes. Everything downstream sees the
rewritten graph: the plan (the V^T GEMM is a GEMM pattern with a column-vector bias, the
attention pattern reads V through the permuted view), the composer, and PyTorch where FACT's
kernels do not win.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from fact.fx_build import NodeBuilder, fake_mode_of, take_name, value_of

aten = torch.ops.aten

_TRANSPOSES = (aten.transpose.int,)
_ALIGN = 4  # fp32 values in 16 bytes: the TF32 kernels' TMA strides
_MATMULS = (aten.matmul.default,)


def applies_v_transposed(dtype: torch.dtype, precision: str, arch: str) -> bool:
    """Whether attention's V should be produced transposed: fp32 models whose attention runs
    on Hopper's TF32 kernels (precision high or medium)."""
    return dtype == torch.float32 and precision in ("high", "medium") and arch == "sm90"


def _only_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _attention_v(node: fx.Node) -> bool:
    """node (B, H, S, D) is read only as the right side of P @ V (attention written out).

    Not SDPA's V: the export decided the layout of what follows SDPA (it drops a
    `.contiguous()` after the output's transpose when SDPA's output is already laid out so)
    from V's layout at trace time, and PyTorch's flash and memory-efficient kernels need V's
    head dim contiguous (they would fall back to the math path). A matmul's output is
    contiguous whatever its operands' strides, so nothing downstream of P @ V changes."""
    if not node.users:
        return False
    return all(
        user.target in _MATMULS and user.args[1] is node and user.args[0] is not node
        for user in node.users
    )


def _heads_transpose(node: fx.Node) -> bool:
    """transpose(view, 1, 2) of a 4-D tensor: (B, S, H, D) -> (B, H, S, D)."""
    if node.target not in _TRANSPOSES or len(node.args) != 3:
        return False
    val = value_of(node.args[0])
    if not isinstance(val, torch.Tensor) or val.dim() != 4:
        return False
    return sorted(d % 4 for d in node.args[1:]) == [1, 2]


def _match(v4: fx.Node) -> dict[str, Any] | None:
    """The projection behind attention V `v4` (a heads transpose), or None."""
    view = v4.args[0]
    if not isinstance(view, fx.Node) or view.target not in (
        aten.view.default,
        aten.reshape.default,  # a view after a layout rewrite (after_layout_changes)
    ):
        return None
    if _only_user(view) is not v4:
        return None
    b, s, h, d = value_of(view).shape  # the view's sizes may say -1
    src = view.args[0]
    part, split = None, None
    if src.target is operator.getitem:
        split, part = src.args
        if _only_user(src) is not view or split.target is not aten.split.Tensor or split.kwargs:
            return None
        linear = split.args[0]
        size = split.args[1]
        dim = split.args[2] if len(split.args) > 2 else 0
        out = value_of(linear)
        if not isinstance(size, int) or dim % 3 != 2 or size != h * d:
            return None
        parts = out.shape[-1] // size
        if (
            out.shape[-1] % size
            or parts < 2
            or part != parts - 1
            or _only_user(linear) is not split
        ):
            return None  # only V as the last of two or more equal parts
    else:
        linear = src
        if _only_user(linear) is not view:
            return None
    if linear.target is not aten.linear.default or linear.kwargs:
        return None
    x, w = linear.args[0], linear.args[1]
    bias = linear.args[2] if len(linear.args) > 2 else None
    xv, wv, outv = value_of(x), value_of(w), value_of(linear)
    if not all(isinstance(t, torch.Tensor) for t in (xv, wv, outv)):
        return None
    if xv.dim() != 3 or tuple(xv.shape[:2]) != (b, s) or not xv.is_contiguous():
        return None
    if wv.dim() != 2 or not wv.is_contiguous() or outv.dtype != torch.float32:
        return None
    if not all(isinstance(v, int) for v in (b, s, h, d)):
        return None  # symbolic sizes: not rewritten
    if s % _ALIGN:
        return None  # V^T's rows (b * s) and each (batch, head)'s start: 16-byte multiples (TMA)
    return {"linear": linear, "split": split, "part": part, "x": x, "w": w, "bias": bias,
            "view": view, "v4": v4, "b": b, "s": s, "h": h, "d": d}  # fmt: skip


def _rewrite(gm: fx.GraphModule, m: dict[str, Any], fake_mode: Any) -> str:
    g = gm.graph
    linear, split, part = m["linear"], m["split"], m["part"]
    x, w, bias = m["x"], m["w"], m["bias"]
    b, s, h, d = m["b"], m["s"], m["h"], m["d"]
    c = h * d
    k = value_of(x).shape[-1]
    add = NodeBuilder(g, linear, fake_mode)
    lo = part * c if split is not None else 0
    w_v = add(aten.slice.Tensor, w, 0, lo, lo + c) if split is not None else w
    x2 = add(aten.view.default, x, [b * s, k])
    xt = add(aten.t.default, x2)
    if bias is not None:
        b_v = add(aten.slice.Tensor, bias, 0, lo, lo + c) if split is not None else bias
        vt = add(aten.addmm.default, add(aten.unsqueeze.default, b_v, 1), w_v, xt)
    else:
        vt = add(aten.mm.default, w_v, xt)
    v = add(aten.permute.default, add(aten.view.default, vt, [h, d, b, s]), [2, 0, 3, 1])
    m["v4"].replace_all_uses_with(v)
    for node in (m["v4"], m["view"]):
        g.erase_node(node)
    what = f"V of {linear.name} as V^T ({c} x {b * s}, keys contiguous)"
    if split is not None:  # the other parts: one linear over the rest of the weight
        rest = [x, add(aten.slice.Tensor, w, 0, 0, lo)]
        if bias is not None:
            rest.append(add(aten.slice.Tensor, bias, 0, 0, lo))
        parts = add(aten.split.Tensor, add(aten.linear.default, *rest), c, 2)
        for user in list(split.users):
            i = user.args[1]
            if i == part:
                g.erase_node(user)
                continue
            user.replace_all_uses_with(add(operator.getitem, parts, i))
            g.erase_node(user)
        g.erase_node(split)
        what += f"; its other parts one linear over rows 0..{lo} of {w.name}"
    g.erase_node(linear)
    return what


def v_transposed(program: torch.export.ExportedProgram) -> list[str]:
    """Rewrite `program`'s graph in place so that attention V comes from a projection that
    writes V^T (see the module docstring). Returns a line per rewrite."""
    gm = program.graph_module
    done = []
    candidates = [n for n in gm.graph.nodes if _heads_transpose(n) and _attention_v(n)]
    fake_mode = fake_mode_of(gm) if candidates else None
    if fake_mode is None:  # no attention V, or no FakeTensor values to build new ones from
        return []
    for v4 in candidates:
        m = _match(v4)
        if m is not None:
            done.append(_rewrite(gm, m, fake_mode))
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


# ---------------------------------------------------------------------------------------------
# Layout algebra: chains of views and layout copies as one layout over their source


class _NotAView(Exception):
    """The chain's composite is not one strided view of its source."""


def _contiguous_modes(shape: Sequence[int]) -> list[list[tuple[int, int]]]:
    modes, stride = [], 1
    for n in reversed(shape):
        modes.append([(n, stride)])
        stride *= n
    return modes[::-1]


def _regroup(atoms: list[tuple[int, int]], sizes: Sequence[int]) -> list[list[tuple[int, int]]]:
    """`atoms` (extent, stride), major first, grouped into modes of `sizes` elements, splitting an
    atom where a size divides it."""
    atoms = [a for a in atoms if a[0] != 1]
    modes = []
    for size in sizes:
        mode, left = [], size
        while left > 1:
            if not atoms:
                raise _NotAView
            e, s = atoms.pop(0)
            if left % e == 0:
                mode.append((e, s))
                left //= e
            elif e % left == 0:
                mode.append((left, s * (e // left)))
                atoms.insert(0, (e // left, s))
                left = 1
            else:
                raise _NotAView
        modes.append(mode or [(1, 0)])
    if atoms:
        raise _NotAView
    return modes


def _numel(mode: list[tuple[int, int]]) -> int:
    return math.prod(e for e, _ in mode)


def _apply(modes: list[list[tuple[int, int]]], offset: int, node: fx.Node, sizes=None):
    """One op of a view chain on a layout over the source's elements (row-major order): the
    layout's modes, each a list of (extent, stride) atoms (a mode that views merged could not
    express has several), and the offset of its first element. A reshape takes the node's
    traced sizes, or `sizes`. Raises _NotAView."""
    t, args = node.target, node.args
    rank = len(modes)
    if t in _COPIES:
        return modes, offset
    if t in _RESHAPES:
        sizes = list(value_of(node).shape if sizes is None else sizes)
        atoms = [a for m in modes for a in m]
        return _regroup(atoms, sizes), offset
    if t is aten.permute.default:
        return [modes[d % rank] for d in args[1]], offset
    if t is aten.transpose.int:
        a, b = args[1] % rank, args[2] % rank
        modes = list(modes)
        modes[a], modes[b] = modes[b], modes[a]
        return modes, offset
    if t is aten.unsqueeze.default:
        d = args[1] % (rank + 1)
        return modes[:d] + [[(1, 0)]] + modes[d:], offset
    if t in (aten.squeeze.dim, aten.squeeze.dims):
        dims = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
        drop = {d % rank for d in dims if _numel(modes[d % rank]) == 1}
        return [m for i, m in enumerate(modes) if i not in drop], offset
    if t is aten.select.int:
        d, i = args[1] % rank, args[2]
        mode = modes[d]
        i %= _numel(mode)
        for e, s in reversed(mode):  # the index's digits, minor first
            offset += (i % e) * s
            i //= e
        return modes[:d] + modes[d + 1 :], offset
    if t is aten.slice.Tensor:
        d = (args[1] if len(args) > 1 else 0) % rank
        n = _numel(modes[d])
        start = args[2] if len(args) > 2 else None
        end = args[3] if len(args) > 3 else None
        step = (args[4] if len(args) > 4 else None) or 1  # export leaves a step of 1 out
        start, end, _ = slice(start, end, step).indices(n)
        live = [a for a in modes[d] if a[0] != 1]
        if len(live) > 1:
            raise _NotAView
        s = live[0][1] if live else 0
        extent = max(0, -(-(end - start) // step))
        modes = list(modes)
        modes[d] = [(extent, s * step)]
        return modes, offset + start * s
    raise _NotAView


# Ops of a chain from a producer to an attention input: views, and copies that change only the
# layout (in an exported graph `.contiguous()` is a clone).
_COPIES = {aten.clone.default, aten.contiguous.default, aten.alias.default}
_RESHAPES = {
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.unflatten.int,
    aten.flatten.using_ints,
}
_CHAIN = (
    _COPIES
    | _RESHAPES
    | {
        aten.permute.default,
        aten.transpose.int,
        aten.unsqueeze.default,
        aten.squeeze.dim,
        aten.squeeze.dims,
        aten.select.int,
        aten.slice.Tensor,
    }
)


def view_chain(node: fx.Node) -> tuple[fx.Node, list[fx.Node]]:
    """The nearest ancestor of `node` that is not a view or layout copy, and the chain of ops
    from it to `node` (first op first)."""
    chain = []
    while isinstance(node, fx.Node) and node.op == "call_function" and node.target in _CHAIN:
        chain.append(node)
        node = node.args[0]
    return node, chain[::-1]


def chain_layout(source_shape: Sequence[int], chain: Sequence[fx.Node]) -> tuple[list, int]:
    """The composite of `chain` on a source of `source_shape`: its modes (one per dim, each a
    list of (extent, stride) atoms over the source's elements in row-major order, major first;
    a dim the chain merged from ones no view can merge has several) and an element offset.
    Raises _NotAView where the chain cuts a merged dim (a slice of one, an unaligned view)."""
    modes, offset = _contiguous_modes(source_shape), 0
    for op in chain:
        modes, offset = _apply(modes, offset, op)
    return modes, offset


def _view_at(val: torch.Tensor, ops) -> torch.Tensor | None:
    """`ops` (view_ops's) on a tensor laid out as `val`, on the meta device: the result, or None
    where one of them would copy."""
    t = torch.empty_strided(tuple(val.shape), tuple(val.stride()), device="meta")
    try:
        for target, args in ops:
            t = t.view(*args) if target is aten.reshape.default else target(t, *args)
    except RuntimeError:
        return None
    return t


def _rows(t: torch.Tensor | None) -> bool:
    """Whether `t` is one row-major matrix over its last dim (what a GEMM reads)."""
    if t is None or t.stride(-1) != 1:
        return False
    try:
        t.view(-1, t.shape[-1])
    except RuntimeError:
        return False
    return True


def is_view(modes: Sequence[list[tuple[int, int]]]) -> bool:
    """Whether a layout is one strided view: no dim of several atoms."""
    return all(len([a for a in mode if a[0] != 1]) <= 1 for mode in modes)


def view_ops(source_shape: Sequence[int], modes: Sequence[list[tuple[int, int]]], offset: int):
    """A layout over a row-major source (chain_layout's), as ops on the source's values: reshape
    into digits, select the digits the layout does not walk, permute, and reshape to the
    layout's sizes where its dims merge digits (or are unit dims). Each op is a view of a source
    laid out row-major (a source laid out otherwise makes a reshape copy, never a wrong read).
    Returns [(target, args after the tensor)], or raises _NotAView where the strides do not
    nest (each a multiple of the span of the ones below it)."""
    total = math.prod(source_shape)
    atoms = [(e, s, (dim, k)) for dim, mode in enumerate(modes) for k, (e, s) in enumerate(mode)]
    walked = sorted((a for a in atoms if a[0] != 1), key=lambda a: -a[1])
    digits: list[tuple[int, Any]] = []  # (extent, (dim, atom)) or (extent, None): selected
    place = total
    for n, s, where in walked:
        if s == 0 or place % (n * s):
            raise _NotAView
        if place // (n * s) > 1:
            digits.append((place // (n * s), None))
        digits.append((n, where))
        place = s
    if place > 1:
        digits.append((place, None))
    # the offset, digit by digit: a selected digit takes its index, a walked one must be 0
    index, rest = [], offset
    for extent, _ in reversed(digits):
        index.append(rest % extent)
        rest //= extent
    index.reverse()
    if rest or any(idx and w is not None for idx, (_, w) in zip(index, digits, strict=True)):
        raise _NotAView
    ops: list[tuple[Any, tuple]] = []
    sizes = [e for e, _ in digits]
    if sizes != list(source_shape):
        ops.append((aten.reshape.default, (sizes,)))
    kept = list(digits)
    for pos in range(len(digits) - 1, -1, -1):
        if digits[pos][1] is None:
            ops.append((aten.select.int, (pos, index[pos])))
            kept.pop(pos)
    order = sorted(range(len(kept)), key=lambda p: kept[p][1])
    if order != list(range(len(kept))):
        ops.append((aten.permute.default, (order,)))
    final = [_numel(mode) for mode in modes]
    if [kept[p][0] for p in order] != final:
        ops.append((aten.reshape.default, (final,)))
    return ops


def attention_inputs_in_place(program: torch.export.ExportedProgram) -> list[str]:
    """Rewrite `program`'s graph in place so that scaled_dot_product_attention reads Q, K and V
    as views of the tensors they were cut from, where the graph copied them on the way (a
    `.contiguous()` before a view that merges dims: nn.MultiheadAttention's packed projection
    is the case in point, 58 MB copied per call in a ViT-B/16 block at batch 64). Each input's
    chain of views and copies is replaced by reshape, select and permute ops on its source
    whenever the chain's composite is one strided view of it with the head dim contiguous. The
    memory order of Q, and with it that of SDPA's output, can change (Hugging Face's
    `.contiguous()` heads; after_layout_changes). Returns a line per rewritten attention."""
    gm = program.graph_module
    sdpas = [n for n in gm.graph.nodes if n.target is aten.scaled_dot_product_attention.default]
    fake_mode = fake_mode_of(gm) if sdpas else None
    if fake_mode is None:
        return []
    done = []
    made: dict[tuple, fx.Node] = {}
    for sdpa in sdpas:
        names = []
        add = NodeBuilder(gm.graph, sdpa.prev, fake_mode)
        for pos in range(3):
            arg = sdpa.args[pos]
            source, chain = view_chain(arg)
            if not any(op.target in _COPIES for op in chain):
                continue
            src, old = value_of(source), value_of(arg)
            if not isinstance(src, torch.Tensor) or not isinstance(old, torch.Tensor):
                continue
            if not all(isinstance(d, int) for d in (*src.shape, *old.shape)):
                continue  # symbolic sizes
            try:
                modes, offset = chain_layout(list(src.shape), chain)
                if not is_view(modes):
                    continue
                ops = view_ops(list(src.shape), modes, offset)
            except _NotAView:
                continue
            read = _view_at(src, ops)
            if read is None or read.stride(-1) != 1:
                continue  # the source is laid out so that this would copy, or read a strided dim
            add.source(arg)
            add.last = sdpa.prev  # new views go just before the attention
            added, new = [], source
            for target, args in ops:  # ops the same as another input's are shared
                key = (new, target, repr(args))
                if key not in made:
                    made[key] = add(target, new, *args)
                    added.append(made[key])
                new = made[key]
            val = value_of(new)
            if tuple(val.shape) != tuple(old.shape):
                for node in reversed(added):
                    gm.graph.erase_node(node)
                    made = {k: v for k, v in made.items() if v is not node}
                continue
            sdpa.replace_input_with(arg, new)
            for node in reversed(chain):  # the old chain, where nothing else reads it
                if not node.users:
                    gm.graph.erase_node(node)
            names.append(f"{'qkv'[pos]} from {source.name}")
        if names:
            done.append(f"{sdpa.name} reads {', '.join(names)} in place (no copy)")
            after_layout_changes(gm, [sdpa])
    return done


def _linears(gm: fx.GraphModule) -> tuple[list[fx.Node], Any]:
    """The graph's linears (none where it has no FakeTensor values to build new nodes from) and
    its FakeTensorMode."""
    linears = [n for n in gm.graph.nodes if n.target is aten.linear.default and not n.kwargs]
    fake_mode = fake_mode_of(gm) if linears else None
    return (linears if fake_mode is not None else []), fake_mode


_PERMUTES = (aten.transpose.int, aten.permute.default)


def _perm_dims(node: fx.Node, rank: int) -> list[int]:
    """The permutation a transpose or permute node applies, as permute's dims."""
    if node.target is aten.transpose.int:
        dims = list(range(rank))
        a, b = node.args[1] % rank, node.args[2] % rank
        dims[a], dims[b] = dims[b], dims[a]
        return dims
    return [d % rank for d in node.args[1]]


def _weight_2d(linear: fx.Node) -> bool:
    w = value_of(linear.args[1])
    return isinstance(w, torch.Tensor) and w.dim() == 2


def linears_before_permutes(program: torch.export.ExportedProgram) -> list[str]:
    """Rewrite `program`'s graph in place so that a linear over a permuted view of a contiguous
    tensor, the permutation keeping the last dim last, becomes that permutation of the linear
    over the tensor: each row of a linear's output depends on its own input row only, so the
    value is the same. nn.MultiheadAttention, batch first, projects `query.transpose(1, 0)`:
    PyTorch's linear copies such an input and adds the bias in a kernel of its own (23 and 117
    us of a ViT-B/16 block at batch 64 on the H200), and FACT's GEMMs read row- or column-major
    operands only. What follows sees another memory order (after_layout_changes). Returns a
    line per rewrite."""
    gm = program.graph_module
    linears, fake_mode = _linears(gm)
    done = []
    for linear in linears:
        perm = linear.args[0]
        if not isinstance(perm, fx.Node) or perm.target not in _PERMUTES:
            continue
        src, val = value_of(perm.args[0]), value_of(perm)
        if not isinstance(src, torch.Tensor) or not isinstance(val, torch.Tensor):
            continue
        rank = src.dim()
        dims = _perm_dims(perm, rank)
        if rank < 3 or dims[-1] != rank - 1 or not src.is_contiguous() or val.is_contiguous():
            continue
        if not _weight_2d(linear):
            continue
        add = NodeBuilder(gm.graph, linear, fake_mode)
        rows = add(aten.linear.default, perm.args[0], *linear.args[1:])
        out = add(aten.permute.default, rows, dims)
        linear.replace_all_uses_with(out)
        name, old = linear.name, value_of(linear)
        gm.graph.erase_node(linear)
        if not perm.users:
            gm.graph.erase_node(perm)
        take_name(rows, name)
        after_layout_changes(gm, [out], {out: old})
        done.append(f"{rows.name} projects {rows.args[0].name} before its permute {dims}")
    return done


_ROW_OPS = _RESHAPES | {
    aten.permute.default,
    aten.transpose.int,
    aten.unsqueeze.default,
    aten.squeeze.dim,
}


def _rows_after(linear: fx.Node) -> list[fx.Node]:
    """The layout ops after `linear`, one user at a time, that rearrange its rows and keep its
    last dim (the output features) last and whole."""
    chain, node = [], linear
    out = value_of(linear).shape[-1]
    while len(node.users) == 1:
        (user,) = node.users
        val = value_of(user)
        if user.target not in _ROW_OPS or user.args[0] is not node or user.kwargs:
            break
        if not isinstance(val, torch.Tensor) or val.dim() < 2 or val.shape[-1] != out or out < 2:
            break
        rank = value_of(node).dim()
        if user.target in _PERMUTES and _perm_dims(user, rank)[-1] != rank - 1:
            break
        chain.append(user)
        node = user
    return chain


def _copied(node: fx.Node) -> bool:
    """Whether a traced reshape or layout copy copied (its input's strides allow no view)."""
    val = value_of(node.args[0])
    if not isinstance(val, torch.Tensor):
        return False
    if node.target in _COPIES:
        return not val.is_contiguous()
    if node.target not in _RESHAPES:
        return False
    return _view_at(val, [(aten.reshape.default, (tuple(value_of(node).shape),))]) is None


def linears_between_permutes(program: torch.export.ExportedProgram) -> list[str]:
    """Rewrite `program`'s graph in place so that a linear whose rows are rearranged before it
    (permutes and reshapes of the leading dims) and after it reads them in the order its result
    is used in. nn.MultiheadAttention's output projection is the case in point: its input is
    the attention's (batch, heads, seq, dim) permuted to (seq, batch) rows, its result viewed
    and transposed back to (batch, seq); read as (batch, seq) rows straight from the attention
    (a view where the attention wrote (batch, seq, heads, dim)), the copy before the linear is
    gone and its result is contiguous, so the residual add after it folds into its epilogue.
    Each row of a linear's output depends on its own input row only, so the value is the same.
    Applied where the traced layouts make the new input a view and the old chain copied (or
    left the result strided). Returns a line per rewrite."""
    gm = program.graph_module
    linears, fake_mode = _linears(gm)
    done = []
    for linear in linears:
        after = _rows_after(linear)
        source, before = view_chain(linear.args[0])
        src, x = value_of(source), value_of(linear.args[0])
        if not after or not before or not isinstance(src, torch.Tensor) or not _weight_2d(linear):
            continue
        if not all(isinstance(d, int) for d in (*src.shape, *value_of(after[-1]).shape)):
            continue
        copied = not x.is_contiguous() or any(_copied(op) for op in before)
        if not copied and value_of(after[-1]).is_contiguous():
            continue
        try:
            modes, offset = chain_layout(list(src.shape), before)
            modes, offset = _replay(modes, offset, after, x.shape[-1])
            ops = view_ops(list(src.shape), modes, offset)
        except _NotAView:
            continue
        if not _rows(_view_at(src, ops)) or [_numel(m) for m in modes[:-1]] != list(
            value_of(after[-1]).shape[:-1]
        ):
            continue
        add = NodeBuilder(gm.graph, linear, fake_mode)
        add.source(linear)
        rows = source
        for target, args in ops:
            rows = add(target, rows, *args)
        new = add(aten.linear.default, rows, *linear.args[1:])
        after[-1].replace_all_uses_with(new)
        name = linear.name
        for node in [*reversed(after), linear, *reversed(before)]:
            if not node.users:
                gm.graph.erase_node(node)
        take_name(new, name)
        after_layout_changes(gm, [new])
        done.append(
            f"{new.name} reads its rows from {source.name} in the order of its result "
            f"{list(value_of(new).shape)}"
        )
    return done


def _replay(modes, offset, after: Sequence[fx.Node], features: int):
    """`after` (the layout ops after a linear) replayed on the linear's input layout: the same
    rearrangement of rows, with `features` input features for the output ones."""
    for op in after:
        sizes = [*value_of(op).shape[:-1], features] if op.target in _RESHAPES else None
        modes, offset = _apply(modes, offset, op, sizes)
    return modes, offset


def _retraceable(gm: fx.GraphModule) -> bool:
    """Whether after_layout_changes can trace every node again: ATen ops and getitem only (not
    the higher-order ops of a `torch.no_grad()` or autocast block, whose bodies are submodules),
    and FakeTensor values to start from."""
    if fake_mode_of(gm) is None:
        return False
    return all(
        isinstance(n.target, torch._ops.OpOverload) or n.target is operator.getitem
        for n in gm.graph.nodes
        if n.op == "call_function"
    )


def after_layout_changes(
    gm: fx.GraphModule, changed: Sequence[fx.Node], traced: dict[fx.Node, Any] | None = None
) -> None:
    """After a rewrite that changed the memory order of `changed`: every `view` downstream of
    them becomes a `reshape` (the same view wherever the strides allow one, a copy where they do
    not: the graph is functional, nothing writes through a view), and the traced values of
    `changed` and of each node downstream are computed again, so that what is planned next
    reads the layouts the graph now has. A graph output keeps its layout: where it was
    contiguous and is no longer, it is copied back (a drop-in module's outputs can be viewed as
    before). `traced`: the values new nodes among `changed` stand in for."""
    fake_mode = fake_mode_of(gm)
    seen, todo = set(changed), list(changed)
    while todo:
        for user in todo.pop().users:
            if user not in seen:
                seen.add(user)
                todo.append(user)
                if user.target is aten.view.default:
                    user.target = aten.reshape.default
    (output,) = (n for n in gm.graph.nodes if n.op == "output")
    outs = [a for a in output.all_input_nodes if a in seen]
    was = {a: (traced or {}).get(a, value_of(a)) for a in outs}
    for node in gm.graph.nodes:  # in order: each one's inputs are traced before it
        if node in seen and node.op == "call_function":
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), value_of)
            with fake_mode:
                node.meta["val"] = node.target(*args, **kwargs)
    for a in outs:
        old, new = was[a], value_of(a)
        if isinstance(old, torch.Tensor) and old.is_contiguous() and not new.is_contiguous():
            add = NodeBuilder(gm.graph, a, fake_mode)
            copy = add(aten.clone.default, a, memory_format=torch.contiguous_format)
            output.replace_input_with(a, copy)
    gm.graph.lint()
    gm.recompile()


def rewrite(
    program: torch.export.ExportedProgram, dtype: torch.dtype, precision: str, arch: str
) -> list[str]:
    """Apply, in place, the layout rewrites that pay off for a `dtype` model under `precision` on
    `arch`: on every target `linears_before_permutes`, `attention_inputs_in_place` and
    `linears_between_permutes`, then `v_transposed` for TF32 on Hopper. `fact.optimize` and
    the CLI's discover, explain and realize of a problem file both plan the rewritten program.
    Returns a line per rewrite."""
    lines = []
    if _retraceable(program.graph_module):
        lines += linears_before_permutes(program)
        lines += attention_inputs_in_place(program)
        lines += linears_between_permutes(program)
    if applies_v_transposed(dtype, precision, arch):
        lines += v_transposed(program)
    return lines
