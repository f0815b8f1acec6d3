"""What a GEMM-family plan pattern computes, in PyTorch: the verification reference and the
unfused PyTorch candidate.

`gemm_spec` reads a pattern the way stage 2 does (GemmSpec::from_pattern in
engine/families/gemm/emit.cpp): the epilogue operands are the operands whose role is neither "a" nor
"b", in plan order, which is the SSA's `operand` index order. `FUNCTIONS` is the epilogue function
table of engine/discover/expr.cpp with the same math and the same parameter defaults; a CPU test
compares it with the C++ table entry by entry.

`eval_pointwise` evaluates the acc-free SSA of a pointwise region (family "pointwise"), whose
`slice_last` / `cat_last` move values along the last dim (LAST_DIM_FUNCTIONS).

Two ways to evaluate an epilogue:
  * `reference`: the GEMM and the epilogue in float64 on upcast inputs (what kernels are checked
    against);
  * `pytorch_candidate`: torch.matmul in the model dtype, then the epilogue with torch ops in the
    model dtype: the unfused PyTorch path every kernel must beat.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from fact.errors import FactError


class NotSupportedError(FactError):
    """The pattern is outside what the tuner handles (family, layout, operand kind)."""


#: Plan dtype names (docs/graph-format.md, engine/ir/graph.cpp) to torch dtypes.
DTYPES: dict[str, torch.dtype] = {
    "f64": torch.float64,
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i64": torch.int64,
    "i32": torch.int32,
    "i16": torch.int16,
    "i8": torch.int8,
    "u8": torch.uint8,
    "bool": torch.bool,
    # spellings people type (the CLI's --dtype), accepted for convenience
    "fp64": torch.float64,
    "fp32": torch.float32,
    "fp16": torch.float16,
}

GEMM_FAMILIES = ("gemm", "horizontal_gemm")
BROADCAST_KINDS = ("row", "col", "scalar", "full")


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise NotSupportedError(f"dtype {name!r} has no torch equivalent here") from None


_TYPE_RE = re.compile(r"^\s*([A-Za-z0-9_]+)\s*\[([^\]]*)\]\s*$")


def parse_type(text: str) -> tuple[str, tuple[int, ...]]:
    """'bf16[128, 512, 768]' -> ('bf16', (128, 512, 768)); 'f32[]' -> ('f32', ())."""
    match = _TYPE_RE.match(text or "")
    if not match:
        raise FactError(f"cannot read the tensor type {text!r} (expected like 'bf16[768]')")
    dims = match.group(2).strip()
    shape = tuple(int(d) for d in dims.split(",")) if dims else ()
    return match.group(1), shape


@dataclass
class OperandSpec:
    """One epilogue operand: what the kernel reads at operands[index]."""

    index: int
    node: str
    kind: str  # row | col | scalar | full
    dtype: str  # plan dtype name
    plan_shape: tuple[int, ...]
    per_batch: bool = False  # a row/col/full operand with its own slice per batch entry


@dataclass
class GemmSpec:
    """A GEMM-family pattern as the kernel sees it (mirrors realize's GemmSpec)."""

    family: str
    dtype_a: str
    dtype_b: str
    dtype_out: str
    layout_a: str
    layout_b: str
    ssa: list[dict[str, Any]]
    text: str
    operands: list[OperandSpec] = field(default_factory=list)
    problem: dict[str, Any] = field(default_factory=dict)

    @property
    def model_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype_a)


def gemm_spec(pattern: dict[str, Any]) -> GemmSpec:
    """Read a plan pattern; NotSupportedError when stage 2 emits no GEMM kernel for it."""
    family = pattern.get("family")
    if family not in GEMM_FAMILIES:
        raise NotSupportedError(f"family {family!r} has no GEMM kernel (tuned: {GEMM_FAMILIES})")
    attrs = pattern.get("attrs") or {}
    try:
        dtypes = [attrs[k] for k in ("dtype_a", "dtype_b", "dtype_out")]
        layouts = [attrs[k] for k in ("layout_a", "layout_b")]
    except KeyError as exc:
        raise FactError(f"pattern attrs lack {exc.args[0]!r}") from None
    for layout in layouts:
        if layout not in ("row", "col"):
            raise NotSupportedError(
                f"an operand has layout {layout!r}: neither row- nor column-major"
            )
    problem = dict(pattern.get("problem") or {})
    batch = int(problem.get("batch", 1))
    operands: list[OperandSpec] = []
    for op in pattern.get("operands") or []:
        if op.get("role") in ("a", "b"):
            continue
        kind = op.get("broadcast") or ""
        if kind not in BROADCAST_KINDS:
            raise NotSupportedError(
                f"epilogue operand {op.get('node')!r} has broadcast kind {kind!r}"
            )
        dtype, shape = parse_type(op.get("type", ""))
        numel = math.prod(shape)
        per_row = {"row": problem.get("n"), "col": problem.get("m")}.get(kind)
        if kind == "full":
            per_row = (problem.get("m") or 0) * (problem.get("n") or 0)
        # A vector given once per batch entry is [batch, n] (batch stride n); otherwise it is
        # shared by every batch entry (batch stride 0).
        per_batch = kind != "scalar" and batch > 1 and per_row is not None
        per_batch = per_batch and numel == batch * per_row
        operands.append(
            OperandSpec(len(operands), op.get("node", ""), kind, dtype, shape, per_batch)
        )
    expr = pattern.get("epilogue_expr")
    if expr:
        ssa, text = list(expr["ssa"]), expr.get("text", "acc")
    elif family == "horizontal_gemm":
        # As emit.cpp: one row operand for the parts' biases (the tuner's inputs hold them
        # concatenated along n, each part's kernel reads its own block), added to acc.
        ssa, text = [{"id": 0, "op": "acc"}], "acc"
        if operands:
            first = operands[0]
            operands = [OperandSpec(0, "bias", "row", first.dtype, (problem.get("n", 0),))]
            ssa += [
                {"id": 1, "op": "operand", "index": 0},
                {"id": 2, "op": "add", "args": [0, 1]},
            ]
            text = "acc + bias"
    else:
        raise NotSupportedError("the pattern has no epilogue_expr")
    return GemmSpec(family, *dtypes, *layouts, ssa, text, operands, problem)


# ---------------------------------------------------------------------------------------------
# The epilogue function table. Values are tensors (or Python floats for constants, so that, as in
# eager PyTorch, a constant does not change a bf16 tensor's dtype). Each entry: (arity, fn(args,
# params)) with params read through _p, which applies expr.cpp's defaults.

Value = torch.Tensor | float


def _p(params: Sequence[Any], i: int, default: float) -> float:
    """Parameter i, or its default when absent. nlohmann::json writes a non-finite double as
    null, so a null parameter is read as its slot's default (clamp's -inf / inf bounds)."""
    if i >= len(params) or params[i] is None:
        return default
    return _number(params[i])


def _number(v: Any) -> float:
    if isinstance(v, str):  # expr.cpp writes non-finite constants as "inf", "-inf", "nan"
        return float(v)
    if v is None:
        raise FactError("an epilogue constant has no value")
    return float(v)


def _flag(x: torch.Tensor, args: Sequence[Any]) -> torch.Tensor:
    """A comparison's bool result as 1.0 / 0.0 (expr.cpp returns doubles), in the dtype of the
    first floating-point tensor argument: the flags then mix with the other values like numbers
    (bool + bool would be a logical or)."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            return x.to(a.dtype)
    return x.to(torch.get_default_dtype())


def _softplus(x: torch.Tensor, beta: float, threshold: float) -> torch.Tensor:
    return F.softplus(x, beta=beta, threshold=threshold)


def _elu(x: torch.Tensor, ps: Sequence[Any]) -> torch.Tensor:
    # aten.elu takes all three: scale * (x > 0 ? x : alpha * (exp(x * input_scale) - 1))
    return torch.ops.aten.elu.default(x, _p(ps, 0, 1.0), _p(ps, 1, 1.0), _p(ps, 2, 1.0))


Fn = Callable[[list[Any], Sequence[Any]], torch.Tensor]

FUNCTIONS: dict[str, tuple[int, Fn]] = {
    "add": (2, lambda a, p: a[0] + a[1]),
    "sub": (2, lambda a, p: a[0] - a[1]),
    "mul": (2, lambda a, p: a[0] * a[1]),
    "div": (2, lambda a, p: a[0] / a[1]),
    "minimum": (2, lambda a, p: torch.minimum(a[0], a[1])),
    "maximum": (2, lambda a, p: torch.maximum(a[0], a[1])),
    "pow": (2, lambda a, p: torch.pow(a[0], a[1])),
    "where": (3, lambda a, p: torch.where(a[0] != 0, a[1], a[2])),
    "eq": (2, lambda a, p: _flag(a[0] == a[1], a)),
    "ne": (2, lambda a, p: _flag(a[0] != a[1], a)),
    "lt": (2, lambda a, p: _flag(a[0] < a[1], a)),
    "le": (2, lambda a, p: _flag(a[0] <= a[1], a)),
    "gt": (2, lambda a, p: _flag(a[0] > a[1], a)),
    "ge": (2, lambda a, p: _flag(a[0] >= a[1], a)),
    "logical_not": (1, lambda a, p: _flag(a[0] == 0, a)),
    "neg": (1, lambda a, p: -a[0]),
    "exp": (1, lambda a, p: torch.exp(a[0])),
    "log": (1, lambda a, p: torch.log(a[0])),
    "log1p": (1, lambda a, p: torch.log1p(a[0])),
    "expm1": (1, lambda a, p: torch.expm1(a[0])),
    "sqrt": (1, lambda a, p: torch.sqrt(a[0])),
    "rsqrt": (1, lambda a, p: torch.rsqrt(a[0])),
    "reciprocal": (1, lambda a, p: torch.reciprocal(a[0])),
    "abs": (1, lambda a, p: torch.abs(a[0])),
    "square": (1, lambda a, p: a[0] * a[0]),
    "erf": (1, lambda a, p: torch.erf(a[0])),
    "sin": (1, lambda a, p: torch.sin(a[0])),
    "cos": (1, lambda a, p: torch.cos(a[0])),
    "tanh": (1, lambda a, p: torch.tanh(a[0])),
    "sigmoid": (1, lambda a, p: torch.sigmoid(a[0])),
    "relu": (1, lambda a, p: torch.relu(a[0])),
    "silu": (1, lambda a, p: F.silu(a[0])),
    "gelu_erf": (1, lambda a, p: F.gelu(a[0])),
    "gelu_tanh": (1, lambda a, p: F.gelu(a[0], approximate="tanh")),
    # x * tanh(softplus(x)) with softplus's default beta 1, threshold 20: F.mish is exactly that
    "mish": (1, lambda a, p: F.mish(a[0])),
    "hardswish": (1, lambda a, p: F.hardswish(a[0])),
    "hardsigmoid": (1, lambda a, p: F.hardsigmoid(a[0])),
    # leaky_relu: params [slope]
    "leaky_relu": (1, lambda a, p: F.leaky_relu(a[0], _p(p, 0, 0.01))),
    # hardtanh and clamp: params [min, max]
    "hardtanh": (1, lambda a, p: F.hardtanh(a[0], _p(p, 0, -1.0), _p(p, 1, 1.0))),
    "clamp": (1, lambda a, p: torch.clamp(a[0], _p(p, 0, -math.inf), _p(p, 1, math.inf))),
    # softplus: params [beta, threshold]
    "softplus": (1, lambda a, p: _softplus(a[0], _p(p, 0, 1.0), _p(p, 1, 20.0))),
    # elu: params [alpha, scale, input_scale]
    "elu": (1, lambda a, p: _elu(a[0], p)),
    # cast: handled in eval_epilogue (it needs the entry's "dtype" and the evaluation mode)
    "cast": (1, lambda a, p: a[0]),
}


def broadcastable(t: torch.Tensor, kind: str) -> torch.Tensor:
    """An operand in the kernel's layout, reshaped to broadcast against acc [.., m, n].

    row [n] or [batch, n] -> [n] / [batch, 1, n]; col [m] or [batch, m] -> [m, 1] /
    [batch, m, 1]; scalar (one element) -> 0-dim, so that, as a PyTorch scalar, it does not
    promote a bf16 accumulator to its own dtype; full [.., m, n] as is. Already-broadcastable
    shapes are returned unchanged.
    """
    if kind == "scalar":
        return t.reshape(())
    if kind == "row":
        return t.unsqueeze(-2) if t.dim() == 2 and t.shape[-2] != 1 else t
    if kind == "col":
        if t.dim() == 1 or (t.dim() == 2 and t.shape[-1] != 1):
            return t.unsqueeze(-1)
        return t
    if kind == "full":
        return t
    raise NotSupportedError(f"epilogue operand kind {kind!r}")


def eval_epilogue(
    ssa: Sequence[dict[str, Any]],
    acc: torch.Tensor,
    operands: Sequence[torch.Tensor],
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Evaluate an epilogue SSA (plan `epilogue_expr.ssa`) on tensors.

    `operands` are broadcast-ready (see `broadcastable`): row [n], col [m, 1], scalar (0-dim or
    one element), full [.., m, n]. With `compute_dtype` (the reference: float64) every leaf is
    converted to it and a `cast` rounds to its dtype and back, so the result stays in
    compute_dtype; without it values keep PyTorch's own dtype flow (the model-dtype candidate)
    and a cast really converts. Returns the root (the last entry), as a tensor shaped like acc.
    """
    if not ssa:
        return acc
    operands = [t.reshape(()) if t.numel() == 1 and t.dim() <= 1 else t for t in operands]
    if compute_dtype is not None:
        acc = acc.to(compute_dtype)
        operands = [t.to(compute_dtype) for t in operands]
    # constants become tensors only where a function has no tensor argument at all
    const_dtype = compute_dtype or (acc.dtype if acc.is_floating_point() else torch.float32)
    last = _run_ssa(ssa, acc, operands, compute_dtype, const_dtype, acc.device)
    if not isinstance(last, torch.Tensor):  # an epilogue that is a constant
        last = torch.full_like(acc, last, dtype=compute_dtype or acc.dtype)
    return last.expand(acc.shape) if last.shape != acc.shape else last


def eval_pointwise(
    ssa: Sequence[dict[str, Any]],
    operands: Sequence[torch.Tensor],
    out_shape: Sequence[int],
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Evaluate the SSA of a pointwise region (plan family "pointwise") to a tensor of out_shape.

    The SSA is an epilogue SSA without "acc": its leaves are operands (indices into the
    pattern's operands, roles in0..inN-1) and constants. Operands come as the graph has them,
    any shapes that broadcast like PyTorch (right-aligned) to out_shape, besides what
    `slice_last` and `cat_last` do along the last dim. Every operand is converted to
    compute_dtype and a `cast` rounds to its dtype and back, as the kernels compute (float32,
    casts rounding). Returns compute_dtype, possibly an expanded view.
    """
    if not ssa:
        raise FactError("a pointwise expression needs at least one SSA entry")
    device = operands[0].device if operands else torch.device("cpu")
    ready = [t.to(compute_dtype) for t in operands]
    last = _run_ssa(ssa, None, ready, compute_dtype, compute_dtype, device)
    shape = tuple(int(d) for d in out_shape)
    if not isinstance(last, torch.Tensor):  # a constant expression
        return torch.full(shape, last, dtype=compute_dtype, device=device)
    try:
        return last.expand(shape) if tuple(last.shape) != shape else last
    except RuntimeError:
        raise FactError(
            f"the pointwise expression's value is shaped {list(last.shape)}, which does not "
            f"broadcast to the output {list(shape)}"
        ) from None


def _run_ssa(
    ssa: Sequence[dict[str, Any]],
    acc: torch.Tensor | None,
    operands: Sequence[torch.Tensor],
    compute_dtype: torch.dtype | None,
    const_dtype: torch.dtype,
    device: torch.device,
) -> Value:
    """The SSA's root value (a tensor, or a float for a constant expression)."""
    values: dict[int, Value] = {}
    last: Value = 0.0 if acc is None else acc
    for entry in ssa:
        op = entry["op"]
        if op == "acc":
            if acc is None:
                raise FactError(
                    f"SSA entry {entry.get('id')} reads acc, but a pointwise expression has no "
                    "accumulator"
                )
            value: Value = acc
        elif op == "operand":
            index = int(entry["index"])
            if not 0 <= index < len(operands):
                raise FactError(f"epilogue operand index {index} out of range ({len(operands)})")
            value = operands[index]
        elif op == "constant":
            value = _number(entry.get("value"))
        elif op in LAST_DIM_FUNCTIONS:
            args = [values[int(a)] for a in entry.get("args", [])]
            params = entry.get("params") or []
            if op == "slice_last":
                if len(args) != 1:
                    raise FactError(f"slice_last takes 1 arg, got {len(args)}")
                value = _slice_last(args[0], params)
            else:
                value = _cat_last(args, params, const_dtype, device)
        else:
            if op not in FUNCTIONS:
                raise NotSupportedError(f"epilogue function {op!r} is not in the function table")
            arity, fn = FUNCTIONS[op]
            args = [values[int(a)] for a in entry.get("args", [])]
            if len(args) != arity:
                raise FactError(f"epilogue function {op!r} takes {arity} args, got {len(args)}")
            if not any(isinstance(a, torch.Tensor) for a in args):
                args[0] = torch.tensor(args[0], dtype=const_dtype, device=device)
            if op in ("minimum", "maximum", "where"):  # tensor-only signatures
                like = next(a for a in args if isinstance(a, torch.Tensor))
                args = [
                    a
                    if isinstance(a, torch.Tensor)
                    else torch.tensor(a, dtype=like.dtype, device=like.device)
                    for a in args
                ]
            if op == "cast":
                value = _cast(args[0], entry.get("dtype", "f32"), compute_dtype)
            else:
                value = fn(args, entry.get("params") or [])
        values[int(entry["id"])] = value
        last = value
    return last


#: Functions of pointwise SSAs that move values along the last dim instead of computing on
#: them: name -> arity (None: one or more args). They are not in FUNCTIONS, which mirrors
#: expr.cpp's table of scalar functions entry by entry.
#:   slice_last  params [start, length]: x[..., start:start + length]; a value whose last dim
#:               is 1 (or a 0-dim value) broadcasts along it and is left as it is
#:   cat_last    params [size0, size1, ...]: torch.cat(args, dim=-1), the args first broadcast
#:               to one shape except the last dim (a piece whose last dim is 1 fills its size)
LAST_DIM_FUNCTIONS: dict[str, int | None] = {"slice_last": 1, "cat_last": None}


def _int_param(params: Sequence[Any], i: int, op: str) -> int:
    if i >= len(params) or params[i] is None:
        raise FactError(f"{op} needs parameter {i} (params {list(params)})")
    return int(_number(params[i]))


def _slice_last(x: Value, params: Sequence[Any]) -> Value:
    start, length = _int_param(params, 0, "slice_last"), _int_param(params, 1, "slice_last")
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] == 1:
        return x  # broadcast along the last dim: every slice of it is the same
    if start < 0 or length < 0 or start + length > x.shape[-1]:
        raise FactError(
            f"slice_last [{start}, {start + length}) is outside a last dim of {x.shape[-1]}"
        )
    return x.narrow(-1, start, length)


def _cat_last(
    args: Sequence[Value], params: Sequence[Any], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    if not args:
        raise FactError("cat_last needs at least one arg")
    if params and len(params) != len(args):
        raise FactError(f"cat_last of {len(args)} args has {len(params)} sizes ({list(params)})")
    pieces = [
        a if isinstance(a, torch.Tensor) else torch.tensor(a, dtype=dtype, device=device)
        for a in args
    ]
    pieces = [t.reshape(1) if t.dim() == 0 else t for t in pieces]
    widths = [_int_param(params, i, "cat_last") for i in range(len(args))] if params else None
    widths = widths or [t.shape[-1] for t in pieces]
    try:
        lead = torch.broadcast_shapes(*(t.shape[:-1] for t in pieces))
    except RuntimeError:
        shapes = [list(t.shape) for t in pieces]
        raise FactError(f"cat_last args shaped {shapes} do not broadcast") from None
    out = []
    for i, (t, width) in enumerate(zip(pieces, widths, strict=True)):
        if t.shape[-1] not in (width, 1):
            raise FactError(
                f"cat_last arg {i} has a last dim of {t.shape[-1]}, its size says {width}"
            )
        out.append(t.expand(*lead, width))
    return torch.cat(out, dim=-1)


def _cast(x: torch.Tensor, dtype: str, compute_dtype: torch.dtype | None) -> torch.Tensor:
    """The model's cast: convert to dtype. In the float64 reference, round to it and come back:
    the model's value at that point is the rounded one, so a kernel must round too."""
    target = torch_dtype(dtype)
    if compute_dtype is None:
        return x.to(target)
    return x.to(target).to(compute_dtype)


def reference(
    pattern: dict[str, Any] | GemmSpec,
    A: torch.Tensor,
    B: torch.Tensor,
    operands: Sequence[torch.Tensor],
) -> torch.Tensor:
    """The pattern's output in float64: (A @ B) on upcast inputs, then the epilogue in float64.

    A [.., m, k], B [.., k, n] (any strides); operands in the kernel's layout (row [n], col [m],
    scalar [1], full [.., m, n]) in SSA index order. Returns float64 [.., m, n].
    """
    spec = pattern if isinstance(pattern, GemmSpec) else gemm_spec(pattern)
    _check_operand_count(spec, operands)
    acc = torch.matmul(A.to(torch.float64), B.to(torch.float64))
    ready = [
        broadcastable(t.to(torch.float64), o.kind)
        for t, o in zip(operands, spec.operands, strict=True)
    ]
    return eval_epilogue(spec.ssa, acc, ready, compute_dtype=torch.float64)


def pytorch_candidate(
    pattern: dict[str, Any] | GemmSpec,
    A: torch.Tensor,
    B: torch.Tensor,
    operands: Sequence[torch.Tensor],
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """The unfused PyTorch path: torch.matmul in the model dtype, then the epilogue with torch
    ops in the model dtype, converted to dtype_out at the end.

    A horizontal GEMM runs as the model did, one matmul (+ bias) per part, and returns the parts
    as a tuple (`as_output` concatenates them for comparison). Inputs as for `reference`.
    """
    spec = pattern if isinstance(pattern, GemmSpec) else gemm_spec(pattern)
    _check_operand_count(spec, operands)
    out_dtype = torch_dtype(spec.dtype_out)
    ready = [broadcastable(t, o.kind) for t, o in zip(operands, spec.operands, strict=True)]
    parts = spec.problem.get("n_parts") if spec.family == "horizontal_gemm" else None
    if parts and sum(parts) == B.shape[-1]:
        outs, start = [], 0
        for width in parts:
            cols = slice(start, start + width)
            acc = torch.matmul(A, B[..., cols])
            sliced = [
                t[..., cols] if o.kind == "row" else t
                for t, o in zip(ready, spec.operands, strict=True)
            ]
            outs.append(eval_epilogue(spec.ssa, acc, sliced).to(out_dtype))
            start += width
        return tuple(outs)
    acc = torch.matmul(A, B)
    return eval_epilogue(spec.ssa, acc, ready).to(out_dtype)


def as_output(result: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """A candidate's result as one [.., m, n] tensor (horizontal parts concatenated along n)."""
    if isinstance(result, torch.Tensor):
        return result
    return torch.cat(list(result), dim=-1)


def _check_operand_count(spec: GemmSpec, operands: Sequence[torch.Tensor]) -> None:
    if len(operands) != len(spec.operands):
        raise FactError(
            f"the epilogue reads {len(spec.operands)} operands, {len(operands)} were given"
        )
