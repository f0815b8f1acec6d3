"""Fresh random inputs for one GEMM-family pattern, laid out as the kernel reads them, and the
FactGemmArgs that point a kernel at them.

Every call draws a new seed unless one is given (the verification protocol: never zeros, never
one fixed seed); the seed is kept in the result so that a failing check can be replayed. The
output D is filled with NaN so that an element the kernel never writes fails the comparison.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fact.errors import FactError
from fact.tune.abi import (
    DECOMPOSITION,
    FACT_MAX_EPILOGUE_OPERANDS,
    FACT_MAX_GEMM_PARTS,
    RASTER,
    REDUCTION,
    FactGemmArgs,
)
from fact.tune.reference import (
    GemmSpec,
    NotSupportedError,
    OperandSpec,
    broadcastable,
    gemm_spec,
    torch_dtype,
)

PROBLEM_KEYS = ("batch", "m", "n", "k")

#: Functions whose argument must stay away from zero and negatives for a finite, well-conditioned
#: reference: an operand read directly by one of them is drawn from [0.5, 2] instead of N(0, 1).
_POSITIVE_ARG = {
    "log": (0,),
    "sqrt": (0,),
    "rsqrt": (0,),
    "reciprocal": (0,),
    "div": (1,),
    "pow": (0,),
}


def resolve_problem(spec: GemmSpec, problem: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The plan's problem with `problem`'s sizes on top ({batch, m, n, k}, all >= 1).

    A GEMM of another family drops n_parts when n no longer equals their sum; a horizontal
    GEMM's n must stay their sum (its kernel runs one GEMM per part): FactError otherwise.
    """
    merged: dict[str, Any] = dict(spec.problem)
    merged.setdefault("batch", 1)
    if problem:
        merged.update({k: v for k, v in problem.items() if v is not None})
    for key in PROBLEM_KEYS:
        if key not in merged:
            raise FactError(f"the problem has no {key!r} (got {sorted(merged)})")
        merged[key] = int(merged[key])
        if merged[key] < 1:
            raise FactError(f"problem size {key}={merged[key]} must be >= 1")
    parts = merged.get("n_parts")
    if parts is not None and sum(parts) != merged["n"]:
        if spec.family == "horizontal_gemm":  # its kernel runs one GEMM per part
            raise FactError(
                f"a horizontal GEMM's n ({merged['n']}) must be the sum of its parts "
                f"{list(parts)}: give n_parts with n"
            )
        merged.pop("n_parts")
    return merged


def problem_label(problem: Mapping[str, Any]) -> str:
    """'b1_m1000_n776_k200': a shape's name in results."""
    return "_".join(f"{key[0]}{problem[key]}" for key in PROBLEM_KEYS)


def alignment(dtype: str) -> int:
    """Elements per 16 bytes: TMA wants 16-byte aligned rows, so contiguous extents (k, n, and m
    for a column-major A) are multiples of this for the kernel to implement the problem."""
    return max(1, 16 // torch.empty((), dtype=torch_dtype(dtype)).element_size())


@dataclass
class GemmInputs:
    """One problem's tensors. A [.., m, k] and B [.., k, n] are logical views (a column-major
    operand is a transposed view of a contiguous tensor); `operands` are in the kernel's layout
    (row [n] or [batch, n], col [m] or [batch, m], scalar [1], full [.., m, n] contiguous)."""

    spec: GemmSpec
    problem: dict[str, Any]
    A: torch.Tensor
    B: torch.Tensor
    operands: list[torch.Tensor]
    D: torch.Tensor
    seed: int
    device: torch.device
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def batched(self) -> bool:
        """Tensors carry a leading batch dimension (batch > 1); batch 1 uses 2-D tensors."""
        return self.D.dim() == 3

    def broadcast_operands(self) -> list[torch.Tensor]:
        """The operands shaped to broadcast against [.., m, n] (for eval_epilogue)."""
        return [
            broadcastable(t, o.kind) for t, o in zip(self.operands, self.spec.operands, strict=True)
        ]

    def poison(self) -> None:
        """Fill D with NaN again (before another run whose output will be checked)."""
        self.D.fill_(math.nan)


def _positive_operands(spec: GemmSpec) -> set[int]:
    """Operand indices read directly as the domain-restricted argument of a function."""
    operand_of = {e["id"]: e["index"] for e in spec.ssa if e["op"] == "operand"}
    positive: set[int] = set()
    for e in spec.ssa:
        for pos in _POSITIVE_ARG.get(e["op"], ()):
            args = e.get("args", [])
            if pos < len(args) and args[pos] in operand_of:
                positive.add(operand_of[args[pos]])
    return positive


def _random(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator, device, how: str):
    """Random values drawn in float32 (every dtype, every device) and converted."""
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen, device=device) < 0.5
    if not dtype.is_floating_point:
        return torch.randint(-3, 4, shape, generator=gen, device=device).to(dtype)
    if how == "positive":
        x = 0.5 + 1.5 * torch.rand(shape, generator=gen, device=device)
    elif how == "scalar":  # a scale: away from zero, either sign
        u = torch.rand(shape, generator=gen, device=device)
        sign = torch.where(torch.rand(shape, generator=gen, device=device) < 0.5, -1.0, 1.0)
        x = sign * (0.5 + 1.5 * u)
    else:
        x = torch.randn(shape, generator=gen, device=device)
    return x.to(dtype)


def _operand_shape(o: OperandSpec, problem: Mapping[str, Any], batched: bool) -> tuple[int, ...]:
    b, m, n = problem["batch"], problem["m"], problem["n"]
    per_batch = o.per_batch and batched
    if o.kind == "row":
        return (b, n) if per_batch else (n,)
    if o.kind == "col":
        return (b, m) if per_batch else (m,)
    if o.kind == "scalar":
        return (1,)
    if o.kind == "full":
        # a full operand follows the output's batching: shared only if the plan says so
        return (b, m, n) if batched and (o.per_batch or not o.plan_shape) else (m, n)
    raise NotSupportedError(f"epilogue operand kind {o.kind!r}")


def make_inputs(
    pattern: dict[str, Any] | GemmSpec,
    problem: Mapping[str, Any] | None = None,
    device: str | torch.device = "cuda",
    seed: int | None = None,
) -> GemmInputs:
    """Fresh inputs for `pattern` at the plan's problem, or at `problem`'s sizes.

    A ~ N(0, 1) and B ~ N(0, 1/k), so that acc ~ N(0, 1) whatever k is and the activations are
    exercised where they bend. Row/col/full operands ~ N(0, 1); scalars +-[0.5, 2]; an operand
    that is a divisor or the argument of log/sqrt/rsqrt/reciprocal/pow's base ~ [0.5, 2].
    D is NaN-filled.
    """
    spec = pattern if isinstance(pattern, GemmSpec) else gemm_spec(pattern)
    prob = resolve_problem(spec, problem)
    if len(spec.operands) > FACT_MAX_EPILOGUE_OPERANDS:
        raise NotSupportedError(f"more than {FACT_MAX_EPILOGUE_OPERANDS} epilogue operands")
    device = torch.device(device)
    seed = secrets.randbits(63) if seed is None else int(seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    b, m, n, k = (prob[key] for key in PROBLEM_KEYS)
    batched = b > 1
    lead = (b,) if batched else ()
    dt_a, dt_b = torch_dtype(spec.dtype_a), torch_dtype(spec.dtype_b)
    # col layout: a transposed view of a contiguous [.., k, m] (A) / [.., n, k] (B)
    if spec.layout_a == "row":
        A = _random((*lead, m, k), dt_a, gen, device, "normal")
    else:
        A = _random((*lead, k, m), dt_a, gen, device, "normal").transpose(-1, -2)
    scale = 1.0 / math.sqrt(k)
    if spec.layout_b == "row":
        B = (_random((*lead, k, n), torch.float32, gen, device, "normal") * scale).to(dt_b)
    else:
        B = (_random((*lead, n, k), torch.float32, gen, device, "normal") * scale).to(dt_b)
        B = B.transpose(-1, -2)
    positive = _positive_operands(spec)
    operands = []
    for o in spec.operands:
        how = "positive" if o.index in positive else "scalar" if o.kind == "scalar" else "normal"
        shape = _operand_shape(o, prob, batched)
        operands.append(_random(shape, torch_dtype(o.dtype), gen, device, how))
    D = torch.full((*lead, m, n), math.nan, dtype=torch_dtype(spec.dtype_out), device=device)
    return GemmInputs(spec, prob, A, B, operands, D, seed, device)


def _knob(knobs: Mapping[str, Any], key: str, default: int) -> int:
    value = knobs.get(key, default)
    names = {"raster": RASTER, "reduction": REDUCTION, "decomposition": DECOMPOSITION}.get(key)
    if names is not None and isinstance(value, str):
        if value not in names:
            raise FactError(f"{key} knob {value!r} is not one of {sorted(names)}")
        return names[value]
    return int(value)


def leading_dim(t: torch.Tensor, layout: str, name: str) -> int:
    """Leading dimension of a [.., rows, cols] view: row-major needs unit column stride,
    column-major unit row stride."""
    if layout == "row":
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise FactError(f"{name} is not row-major (strides {t.stride()})")
        return t.stride(-2)
    if t.stride(-2) != 1 and t.shape[-2] > 1:
        raise FactError(f"{name} is not column-major (strides {t.stride()})")
    return t.stride(-1)


def _batch_stride(t: torch.Tensor, fallback: int) -> int:
    return t.stride(0) if t.dim() == 3 else fallback


def gemm_args(
    inputs: GemmInputs,
    knobs: Mapping[str, Any] | None = None,
    sm_count: int = 0,
) -> FactGemmArgs:
    """FactGemmArgs pointing at `inputs` (keep `inputs` alive while the kernel may run).

    knobs: LaunchKnobs JSON ({"raster": "heuristic" | "along_m" | "along_n", "max_swizzle":
    1/2/4/8, "splits": n, "reduction": "deterministic" | "nondeterministic", "decomposition":
    "heuristic" | "stream_k" | "data_parallel"}); raster, reduction and decomposition may also be
    the ABI's ints. A missing knob takes its default.
    """
    knobs = knobs or {}
    p = inputs.problem
    m, n, k = p["m"], p["n"], p["k"]
    args = FactGemmArgs()
    args.m, args.n, args.k, args.batch = m, n, k, p["batch"]
    args.a = inputs.A.data_ptr()
    args.lda = leading_dim(inputs.A, inputs.spec.layout_a, "A")
    args.batch_stride_a = _batch_stride(inputs.A, m * k)
    args.b = inputs.B.data_ptr()
    args.ldb = leading_dim(inputs.B, inputs.spec.layout_b, "B")
    args.batch_stride_b = _batch_stride(inputs.B, k * n)
    args.d = inputs.D.data_ptr()
    args.ldd = leading_dim(inputs.D, "row", "D")
    args.batch_stride_d = _batch_stride(inputs.D, m * n)
    for i, (t, o) in enumerate(zip(inputs.operands, inputs.spec.operands, strict=True)):
        args.operands[i] = t.data_ptr()
        if o.kind == "full":
            args.operand_ld[i] = leading_dim(t, "row", f"operand {i}")
            args.operand_batch_stride[i] = t.stride(0) if t.dim() == 3 else 0
        else:
            # a [batch, len] vector steps by its length per batch entry; a shared one stays put
            args.operand_ld[i] = 0
            args.operand_batch_stride[i] = t.stride(0) if t.dim() == 2 else 0
    if inputs.spec.family == "horizontal_gemm" and p.get("n_parts"):
        # The parts are the column blocks of B, D and the bias row: one GEMM each.
        parts, start = [], 0
        bias = inputs.operands[0] if inputs.operands else None
        for width in p["n_parts"]:
            cols = slice(start, start + width)
            part_bias = bias[..., cols] if bias is not None else None
            parts.append((inputs.B[..., cols], inputs.D[..., cols], part_bias))
            start += width
        set_parts(args, parts, inputs.spec.layout_b)
    set_knobs(args, knobs, sm_count)
    return args


def set_knobs(args: FactGemmArgs, knobs: Mapping[str, Any], sm_count: int = 0) -> None:
    """The launch knobs (LaunchKnobs JSON, see gemm_args; missing ones take their defaults) and
    the SM count (0: the kernel asks the device) into `args`."""
    args.raster = _knob(knobs, "raster", 0)
    args.max_swizzle = _knob(knobs, "max_swizzle", 1)
    args.splits = _knob(knobs, "splits", 1)
    args.reduction = _knob(knobs, "reduction", 0)
    args.decomposition = _knob(knobs, "decomposition", 0)
    args.sm_count = int(sm_count)


def set_parts(
    args: FactGemmArgs,
    parts: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
    layout_b: str,
) -> None:
    """The parts of a horizontally fused GEMM into `args`: each (B_p [k, n_p] in layout_b, D_p
    [m, n_p] row-major, bias_p [n_p] contiguous or None). `args` keeps m, k, A; n becomes the
    parts' sum."""
    if not 0 < len(parts) <= FACT_MAX_GEMM_PARTS:
        raise FactError(f"a horizontal GEMM has 1 to {FACT_MAX_GEMM_PARTS} parts, got {len(parts)}")
    args.n_parts = len(parts)
    args.n = 0
    for i, (b, d, bias) in enumerate(parts):
        if b.shape[-1] != d.shape[-1] or (bias is not None and bias.shape[-1] != d.shape[-1]):
            raise FactError(
                f"part {i}: B {tuple(b.shape)}, D {tuple(d.shape)} and bias "
                f"{None if bias is None else tuple(bias.shape)} disagree on n"
            )
        if bias is not None and bias.stride(-1) != 1 and bias.shape[-1] > 1:
            raise FactError(f"part {i}: the bias is not contiguous (strides {bias.stride()})")
        part = args.parts[i]
        part.n = d.shape[-1]
        part.b, part.ldb = b.data_ptr(), leading_dim(b, layout_b, f"part {i} B")
        part.d, part.ldd = d.data_ptr(), leading_dim(d, "row", f"part {i} D")
        part.bias = bias.data_ptr() if bias is not None else None
        args.n += part.n


def split_parts(n: int, count: int, align: int) -> list[int] | None:
    """n columns as `count` parts, each a multiple of `align` but the last (None when too few)."""
    if count < 1:
        return None
    base = n // count // align * align
    if base < 1:
        return None
    return [base] * (count - 1) + [n - base * (count - 1)]


def verification_shapes(
    pattern: dict[str, Any] | GemmSpec, problem: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The shapes a kernel is checked on: the problem itself, a ragged one (m=1000, n=776 and a
    k that is no multiple of any tile_k; batch 3 when batched) and a small ragged one.

    Ragged sizes are rounded up to the operands' 16-byte alignment (TMA's requirement), so a
    kernel that can implement the main problem can implement these too.
    """
    spec = pattern if isinstance(pattern, GemmSpec) else gemm_spec(pattern)
    main = resolve_problem(spec, problem)
    dtypes = [spec.dtype_a, spec.dtype_b, spec.dtype_out] + [o.dtype for o in spec.operands]
    align = max(alignment(d) for d in dtypes if d in ("f64", "f32", "f16", "bf16"))

    def up(v: int) -> int:
        return -(-v // align) * align

    batch = 3 if main["batch"] > 1 else 1
    shapes = [
        {key: main[key] for key in PROBLEM_KEYS},
        {"batch": batch, "m": up(1000), "n": up(776), "k": up(200)},
        {"batch": batch, "m": up(24), "n": up(40), "k": up(72)},
    ]
    if main.get("n_parts"):  # a horizontal GEMM: as many parts at every shape, or no shape
        shapes[0]["n_parts"] = list(main["n_parts"])
        for s in shapes[1:]:
            s["n_parts"] = split_parts(s["n"], len(main["n_parts"]), align)
        shapes = [s for s in shapes if s["n_parts"]]
    unique: list[dict[str, Any]] = []
    for s in shapes:
        if s not in unique:
            unique.append(s)
    return unique
