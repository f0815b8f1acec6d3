"""Layout rewrites of an exported graph, before it is planned: a producer writes the layout its
consumer's kernels read, so that no kernel has to copy between them.

`rewrite` applies those that pay off for a target. One rewrite so far, `v_transposed`: under
TF32 on Hopper, attention's V is produced transposed. Hopper's TF32 WGMMAs read shared memory
K-major only, so FACT's TF32 attention kernels transpose V (batch, seq, heads, dim) into (dim,
keys) before P @ V (117 us of 466 at the MiniGPT shape), unless V arrives with its keys
contiguous, which they read in place (attention ABI version 4, `v_stride_d`). A projection can
write V that way at no extra cost: V^T = W_v x^T + b_v is a GEMM with M = heads * dim and N =
batch * seq whose row-major output holds every (batch, head)'s V^T with the keys contiguous,
and its bias is a column vector in the epilogue. So where V is

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

import operator
from typing import Any

import torch
from torch import fx

from fact.fx_build import NodeBuilder, fake_mode_of, value_of

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
    if not isinstance(view, fx.Node) or view.target is not aten.view.default:
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


def rewrite(
    program: torch.export.ExportedProgram, dtype: torch.dtype, precision: str, arch: str
) -> list[str]:
    """Apply, in place, the layout rewrites that pay off for a `dtype` model under `precision` on
    `arch` (so far `v_transposed`, for TF32 on Hopper). `fact.optimize` and the CLI's
    discover, explain and realize of a problem file both plan the rewritten program. Returns a
    line per rewrite."""
    if applies_v_transposed(dtype, precision, arch):
        return v_transposed(program)
    return []
