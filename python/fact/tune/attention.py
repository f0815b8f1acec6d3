"""Fused attention kernels (plan family "attention"): what a pattern computes, fresh inputs laid
out the way models lay them out, the FactAttentionArgs that point a kernel at them, and the
verification and timing of one kernel or of PyTorch's scaled_dot_product_attention.

    spec = AttentionSpec.from_pattern(pattern)          # NotSupportedError: why not
    inputs = make_inputs(spec, "cuda")                  # q, k, v (B, H, S, D) views; o NaN-filled
    run_kernel(KernelLibrary(path), inputs.q, inputs.k, inputs.v, inputs.o, spec)
    err, why = harness.rel_err(inputs.o, reference(spec, inputs.q, inputs.k, inputs.v))

The kernel ABI is engine/families/attention/fact_attention_abi.h:
O[b, h, s] = softmax(scale * Q[b, h, s] . K[b, hk, :]^T (+ causal mask)) @ V[b, hk, :] with
hk = h // (heads // kv_heads) (grouped-query attention as repeat_interleave), the causal mask
top-left aligned (query s sees keys t <= s, as PyTorch's is_causal), every tensor through its own
element strides.

`evaluate_attention_kernel` and `evaluate_attention_pytorch` return the harness's result rows
(harness.make_row); harness.evaluate_kernel / evaluate_pytorch / tune dispatch here for
attention patterns, so the fault-isolated driver, the CLI and the registry export work unchanged.
An attention kernel has no launch knobs: a passed row's knobs are {}.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F

from fact.errors import FactError
from fact.tune import harness
from fact.tune.abi import (
    FactAttentionArgs,
    KernelLibrary,
    KernelStatusError,
    Status,
    status_name,
)
from fact.tune.reference import NotSupportedError, torch_dtype

FAMILY = "attention"
#: The problem's sizes (docs/plan-format.md); a problem override may set any of them.
PROBLEM_KEYS = ("batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim", "head_dim_v")
#: Q/K/V/O element types the kernels are generated for (engine/families/attention/attention.cpp):
#: bf16 and f16 by Hopper's FMHA; f32 by Hopper's FMHA in TF32 or the sm80 kernel in TF32 where the
#: precision allows TF32, by the sm80 kernel in 3xTF32 under "highest".
DTYPES = ("bf16", "f16", "f32")
#: Pattern steps a fused attention kernel computes (dropout: identity in inference).
STEPS = ("scale", "causal_mask", "softmax", "dropout")
OUT_LAYOUTS = ("bs(hd)", "bhsd")
#: The reference's score and probability blocks, per chunk (both at once, in its dtype).
REFERENCE_BUDGET_BYTES = 1 << 30


# ---------------------------------------------------------------------------------------------
# The pattern


@dataclass(frozen=True)
class AttentionSpec:
    """An attention pattern as the tuner sees it, at one problem size.

    fused_qkv: the plan reads Q, K and V from one tensor (a fused QKV projection, as MiniGPT's
    c_attn), so the inputs are made that way too; out_layout: "bs(hd)" (the model's
    (batch, seq, heads*dim), written in place) or "bhsd" (a contiguous (batch, heads, seq, dim)).
    fused_qk: Q and K alone come from one tensor (after fact.layouts took V out of a fused
    QKV projection).
    v_keys: the plan's V has its keys contiguous (attrs v_strides; a projection that writes V^T,
    fact.layouts), so the inputs are made that way too: the TF32 Hopper kernels read it in
    place, any other kernel gets a copy with the head dim contiguous on every call, as
    fact::attention gives it one.
    """

    dtype: str
    causal: bool
    scale: float
    problem: dict[str, int]
    out_layout: str = "bs(hd)"
    fused_qkv: bool = False
    fused_qk: bool = False
    v_keys: bool = False
    signature: str = ""
    rule: str = ""
    pattern_problem: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_pattern(
        cls, pattern: Mapping[str, Any], problem: Mapping[str, Any] | None = None
    ) -> AttentionSpec:
        """Read a plan pattern of family "attention", with `problem`'s sizes on top (keys of
        other families' problems, such as a GEMM's m, n, k, are ignored, so one override can
        serve a whole plan). NotSupportedError says what is not handled."""
        family = pattern.get("family")
        if family != FAMILY:
            raise NotSupportedError(f"family {family!r} is not attention")
        steps = [s for s in pattern.get("epilogue") or [] if s not in STEPS]
        if steps:
            raise NotSupportedError(
                f"attention step(s) {steps} have no place in a fused attention kernel "
                f"(it computes {', '.join(STEPS)})"
            )
        attrs = pattern.get("attrs") or {}
        dtype = attrs.get("dtype")
        if dtype not in DTYPES:
            raise NotSupportedError(
                f"attention in {dtype!r}: kernels are generated for {' and '.join(DTYPES)} only"
            )
        out_dtype = attrs.get("out_dtype", dtype)
        if out_dtype != dtype:
            raise NotSupportedError(f"attention output in {out_dtype!r} from {dtype!r} inputs")
        scale = attrs.get("scale")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            raise NotSupportedError(
                f"attention without a positive constant softmax scale ({scale!r})"
            )
        if not math.isfinite(scale):
            raise NotSupportedError(f"attention softmax scale {scale!r} is not finite")
        out_layout = attrs.get("out_layout", "bs(hd)")
        if out_layout not in OUT_LAYOUTS:
            raise NotSupportedError(f"attention output layout {out_layout!r} ({OUT_LAYOUTS})")
        sources = [attrs.get(f"{r}_source") for r in "qkv"]
        spec = cls(
            dtype=dtype,
            causal=bool(attrs.get("causal", False)),
            scale=float(scale),
            problem={},
            out_layout=out_layout,
            fused_qkv=sources[0] is not None and len(set(sources)) == 1,
            fused_qk=sources[0] is not None and sources[0] == sources[1] != sources[2],
            v_keys=_keys_contiguous(attrs.get("v_strides")),
            signature=str(pattern.get("signature", "")),
            rule=str(pattern.get("rule", "")),
            pattern_problem=dict(pattern.get("problem") or {}),
        )
        return spec.with_problem(problem)

    def with_problem(self, problem: Mapping[str, Any] | None = None) -> AttentionSpec:
        """The same pattern at other sizes (partial; on top of the plan's problem). Setting
        head_dim alone sets head_dim_v too."""
        merged: dict[str, Any] = dict(self.pattern_problem)
        merged.update(self.problem)
        if problem:
            override = {k: v for k, v in problem.items() if k in PROBLEM_KEYS and v is not None}
            if "head_dim" in override and "head_dim_v" not in override:
                override["head_dim_v"] = override["head_dim"]
            merged.update(override)
        for key in PROBLEM_KEYS:
            value = merged.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise FactError(f"the attention problem has no integer {key!r} (got {merged})")
            if int(value) != value or value < 1:
                raise FactError(f"attention problem size {key}={value} must be an integer >= 1")
            merged[key] = int(value)
        if merged["head_dim"] != merged["head_dim_v"]:
            raise NotSupportedError(
                f"value head dim {merged['head_dim_v']} differs from the query's "
                f"{merged['head_dim']} (the kernels have one head dim)"
            )
        if merged["heads"] % merged["kv_heads"]:
            raise NotSupportedError(
                f"heads {merged['heads']} is not a multiple of kv_heads {merged['kv_heads']}"
            )
        return replace(self, problem=merged)

    # sizes
    @property
    def batch(self) -> int:
        return self.problem["batch"]

    @property
    def heads(self) -> int:
        return self.problem["heads"]

    @property
    def kv_heads(self) -> int:
        return self.problem["kv_heads"]

    @property
    def seq_q(self) -> int:
        return self.problem["seq_q"]

    @property
    def seq_k(self) -> int:
        return self.problem["seq_k"]

    @property
    def head_dim(self) -> int:
        return self.problem["head_dim"]

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.heads // self.kv_heads

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)

    @property
    def label(self) -> str:
        """'b2_h8_kv2_q500_k500_d128': a shape's name in results."""
        p = self.problem
        return (
            f"b{p['batch']}_h{p['heads']}_kv{p['kv_heads']}_q{p['seq_q']}_k{p['seq_k']}"
            f"_d{p['head_dim']}"
        )


def _keys_contiguous(strides: Any) -> bool:
    """(batch, heads, seq, dim) strides of a V whose keys are contiguous and head dim not."""
    if not isinstance(strides, (list, tuple)) or len(strides) != 4:
        return False
    return strides[2] == 1 and isinstance(strides[3], int) and strides[3] > 1


def _spec(pattern: Any, problem: Mapping[str, Any] | None = None) -> AttentionSpec:
    if isinstance(pattern, AttentionSpec):
        return pattern.with_problem(problem)
    return AttentionSpec.from_pattern(pattern, problem)


def check_kernel_info(
    info: Mapping[str, Any], spec: AttentionSpec, precision: str | None = None
) -> list[str]:
    """Where an attention kernel's fact_kernel_info() disagrees with the pattern (empty when it
    fits): family, dtype, causal, a head dim the kernel serves (its info's head_dim is the
    largest), and, given the float32 matmul precision, a math it allows (TF32 is not
    fp32-accurate: not under "highest"). Keys the info lacks are not checked."""
    problems = []
    if precision == "highest" and info.get("math") == "tf32":
        problems.append("math: kernel 'tf32', precision 'highest' asks for fp32-accurate results")
    if "family" in info and info["family"] != FAMILY:
        problems.append(f"family: kernel {info['family']!r}, pattern 'attention'")
    if "dtype" in info and info["dtype"] != spec.dtype:
        problems.append(f"dtype: kernel {info['dtype']!r}, pattern {spec.dtype!r}")
    if "causal" in info and bool(info["causal"]) != spec.causal:
        problems.append(f"causal: kernel {info['causal']}, pattern {spec.causal}")
    if "head_dim" in info and not spec.head_dim <= int(info["head_dim"]):
        problems.append(
            f"head_dim: kernel serves up to {info['head_dim']}, pattern {spec.head_dim}"
        )
    return problems


# ---------------------------------------------------------------------------------------------
# Inputs


@dataclass
class AttentionInputs:
    """One problem's tensors: q (B, H, Sq, D), k and v (B, Hk, Sk, D), o (B, H, Sq, D), each a
    view whose last dim is contiguous (see make_inputs for the buffers under them)."""

    spec: AttentionSpec
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    seed: int
    device: torch.device

    def poison(self) -> None:
        """Fill o with NaN again (before another run whose output will be checked)."""
        self.o.fill_(math.nan)


def make_inputs(
    spec: AttentionSpec | Mapping[str, Any],
    device: str | torch.device = "cuda",
    seed: int | None = None,
    *,
    layout: str | None = None,
) -> AttentionInputs:
    """Fresh q, k, v ~ N(0, 1) in the model dtype and a NaN-filled output, as models lay them out.

    layout "separate": q, k and v are (B, H, S, D) views of their own (B, S, H, D)-contiguous
    buffers (a projection's output viewed per head and transposed, as Llama); "fused": views of
    one (B, S, H + 2*Hk, D) buffer (a fused QKV projection split along its last dim, as
    MiniGPT's c_attn). Default: the plan's (spec.fused_qkv), "separate" when seq_q != seq_k.
    With fused_qk (and layout "separate"), q and k are views of one (B, S, H + Hk, D) buffer.
    For a spec with v_keys, v is instead a (B, Hk, Sk, D) view of a (Hk * D, B * Sk) buffer,
    its keys contiguous (what a projection that writes V^T leaves).
    o is a (B, H, Sq, D) view of a (B, Sq, H, D) buffer for out_layout "bs(hd)" (the model's
    (batch, seq, heads*dim), written in place), a contiguous (B, H, Sq, D) one for "bhsd".
    A new seed every call unless one is given (kept in the result, to replay a failure).
    """
    if not isinstance(spec, AttentionSpec):
        spec = AttentionSpec.from_pattern(spec)
    layout = layout or ("fused" if spec.fused_qkv else "separate")
    if layout not in ("fused", "separate"):
        raise FactError(f"attention input layout {layout!r} is not 'fused' or 'separate'")
    if layout == "fused" and spec.seq_q != spec.seq_k:
        layout = "separate"  # one projection gives one sequence length
    device = torch.device(device)
    seed = secrets.randbits(63) if seed is None else int(seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    b, h, hk, sq, sk, d = (spec.problem[k] for k in PROBLEM_KEYS[:6])
    dt = spec.torch_dtype

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device).to(dt)

    def new_v() -> torch.Tensor:
        if spec.v_keys:  # (Hk * D, B * Sk) row-major, seen as (B, Hk, Sk, D)
            return randn(hk * d, b * sk).view(hk, d, b, sk).permute(2, 0, 3, 1)
        return randn(b, sk, hk, d).transpose(1, 2)

    if layout == "fused":
        qkv = randn(b, sq, h + 2 * hk, d)
        q = qkv[:, :, :h].transpose(1, 2)
        k = qkv[:, :, h : h + hk].transpose(1, 2)
        v = new_v() if spec.v_keys else qkv[:, :, h + hk :].transpose(1, 2)
    elif spec.fused_qk and sq == sk:  # one (B, S, H + Hk, D) buffer for Q and K
        qk = randn(b, sq, h + hk, d)
        q = qk[:, :, :h].transpose(1, 2)
        k = qk[:, :, h:].transpose(1, 2)
        v = new_v()
    else:
        q = randn(b, sq, h, d).transpose(1, 2)
        k = randn(b, sk, hk, d).transpose(1, 2)
        v = new_v()
    if spec.out_layout == "bhsd":
        o = torch.full((b, h, sq, d), math.nan, dtype=dt, device=device)
    else:
        o = torch.full((b, sq, h, d), math.nan, dtype=dt, device=device).transpose(1, 2)
    return AttentionInputs(spec, q, k, v, o, seed, device)


# ---------------------------------------------------------------------------------------------
# Reference


@contextlib.contextmanager
def _full_precision_matmuls() -> Iterator[None]:
    """float32 matmuls in float32, whatever precision the tuning worker set (TF32 would put
    ~1e-3 into the reference)."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def reference(
    spec: AttentionSpec | Mapping[str, Any],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    dtype: torch.dtype | None = None,
    budget_bytes: int = REFERENCE_BUDGET_BYTES,
) -> torch.Tensor:
    """softmax(scale * q @ k^T (+ top-left causal mask)) @ v, (B, H, Sq, Dv), with an explicit
    softmax (max, exp, sum) in `dtype`: float32 on a GPU (float32 matmuls, no TF32), float64 on
    the CPU by default. Grouped-query attention repeats K/V heads (repeat_interleave). The work
    is chunked over batch (and heads, when one batch entry's scores are too many) so that the
    (chunk, Sq, Sk) scores and probabilities stay under budget_bytes together: B=4, H=32,
    S=2048 and B=128, H=8, S=512 fit.

    The spec's problem sizes are not used: the tensors' shapes are (only causal and scale are).
    """
    if not isinstance(spec, AttentionSpec):
        spec = AttentionSpec.from_pattern(spec)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise FactError("attention reference: q, k, v must be (batch, heads, seq, dim)")
    b, h, sq, _ = q.shape
    hk, sk = k.shape[1], k.shape[2]
    if h % hk:
        raise FactError(f"attention reference: {h} query heads, {hk} key/value heads")
    group = h // hk
    ct = dtype or (torch.float64 if q.device.type == "cpu" else torch.float32)
    out = torch.empty((b, h, sq, v.shape[-1]), dtype=ct, device=q.device)
    per_head = 2 * sq * sk * torch.empty((), dtype=ct).element_size()
    heads_per_chunk = max(1, min(h, budget_bytes // per_head))
    batch_per_chunk = max(1, budget_bytes // (per_head * h)) if heads_per_chunk == h else 1
    kv_index = torch.arange(hk, device=q.device).repeat_interleave(group)  # query head -> kv head
    mask = None
    if spec.causal:  # top-left aligned: query s sees keys t <= s
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(1)
    with _full_precision_matmuls():
        for b0 in range(0, b, batch_per_chunk):
            b1 = min(b, b0 + batch_per_chunk)
            for h0 in range(0, h, heads_per_chunk):
                h1 = min(h, h0 + heads_per_chunk)
                idx = kv_index[h0:h1]
                qc = q[b0:b1, h0:h1].to(ct)
                kc = k[b0:b1].index_select(1, idx).to(ct)
                vc = v[b0:b1].index_select(1, idx).to(ct)
                scores = torch.matmul(qc, kc.transpose(-1, -2)).mul_(spec.scale)
                if mask is not None:
                    scores.masked_fill_(mask, -math.inf)
                scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()
                scores.div_(scores.sum(dim=-1, keepdim=True))
                out[b0:b1, h0:h1] = torch.matmul(scores, vc)
                del scores, qc, kc, vc
    return out


def pytorch_attention(
    spec: AttentionSpec | Mapping[str, Any],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The PyTorch candidate: F.scaled_dot_product_attention in the model dtype (is_causal,
    the pattern's scale, enable_gqa when kv_heads < heads), written into `out` when given (the
    pattern's output layout: the model's transpose(1, 2).contiguous() after the attention)."""
    if not isinstance(spec, AttentionSpec):
        spec = AttentionSpec.from_pattern(spec)
    kwargs: dict[str, Any] = {"is_causal": spec.causal, "scale": spec.scale}
    if k.shape[1] != q.shape[1]:
        kwargs["enable_gqa"] = True
    y = F.scaled_dot_product_attention(q, k, v, **kwargs)
    if out is None:
        return y
    out.copy_(y)
    return out


# ---------------------------------------------------------------------------------------------
# The ABI


def v_keys_contiguous(v: torch.Tensor) -> bool:
    """V (B, Hk, Sk, D) laid out with its keys contiguous and its head dim not: what a
    projection that writes V^T leaves, and what TF32 kernels read in place (kernel info
    "v_keys_contiguous"; ABI v_stride_d)."""
    return v.shape[-1] > 1 and v.stride(-1) > 1 and (v.stride(2) == 1 or v.shape[2] == 1)


def as_keys_contiguous(v: torch.Tensor) -> torch.Tensor:
    """A copy of V (B, Hk, Sk, D) laid out as a projection that writes V^T leaves it: a
    (Hk * D, B * Sk) row-major buffer viewed as (B, Hk, Sk, D), keys contiguous."""
    b, hk, sk, d = v.shape
    vt = torch.empty(hk * d, b * sk, dtype=v.dtype, device=v.device)
    out = vt.view(hk, d, b, sk).permute(2, 0, 3, 1)
    out.copy_(v)
    return out


def _strides(t: torch.Tensor, name: str) -> tuple[int, int, int]:
    if t.stride(-1) != 1 and t.shape[-1] > 1 and not (name == "v" and v_keys_contiguous(t)):
        raise FactError(
            f"attention {name}: the head dim must be contiguous"
            + (" or, for v, the keys" if name == "v" else "")
            + f" (shape {tuple(t.shape)}, strides {t.stride()})"
        )
    return t.stride(0), t.stride(1), t.stride(2)


def args_for(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    scale: float,
    sm_count: int = 0,
) -> FactAttentionArgs:
    """FactAttentionArgs over (B, H, Sq, D) q and o and (B, Hk, Sk, D) k and v, any strides with
    a contiguous last dim, or for v contiguous keys (v_stride_d then carries its head-dim stride;
    only kernels whose info says "v_keys_contiguous" accept it). Keep the tensors alive while the
    kernel may run."""
    tensors = {"q": q, "k": k, "v": v, "o": o}
    for name, t in tensors.items():
        if t.dim() != 4:
            raise FactError(
                f"attention {name} must be (batch, heads, seq, dim), got {tuple(t.shape)}"
            )
        if t.dtype != q.dtype or t.device != q.device:
            raise FactError(
                f"attention {name} is {t.dtype} on {t.device}, q is {q.dtype} on {q.device}"
            )
    b, h, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    if tuple(k.shape) != (b, hk, sk, d) or tuple(v.shape) != (b, hk, sk, d):
        raise FactError(
            f"attention k {tuple(k.shape)} and v {tuple(v.shape)} must both be "
            f"(batch={b}, kv_heads, seq_k, head_dim={d})"
        )
    if tuple(o.shape) != (b, h, sq, d):
        raise FactError(f"attention o {tuple(o.shape)} must be q's shape {tuple(q.shape)}")
    if hk < 1 or h % hk:
        raise FactError(f"attention: {h} query heads is not a multiple of {hk} key/value heads")
    args = FactAttentionArgs()
    args.batch, args.heads, args.kv_heads = b, h, hk
    args.seq_q, args.seq_k, args.head_dim = sq, sk, d
    for name, t in tensors.items():
        setattr(args, name, t.data_ptr())
        sb, sh, ss = _strides(t, name)
        setattr(args, f"{name}_stride_b", sb)
        setattr(args, f"{name}_stride_h", sh)
        setattr(args, f"{name}_stride_s", ss)
    if v_keys_contiguous(v):
        args.v_stride_s = 1  # a single key: any stride reads the same
        args.v_stride_d = v.stride(-1)
    args.scale = float(scale)
    args.sm_count = int(sm_count)
    return args


def _stream_ptr(device: torch.device) -> int | None:
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None


class _Launch:
    """A prepared launch: args, workspace and stream fixed, so that a timed rep is one ABI call.
    Failures are kept in `failed` (a timing loop must not raise between events)."""

    def __init__(
        self,
        lib: KernelLibrary,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        o: torch.Tensor,
        scale: float,
        workspace: torch.Tensor | None = None,
        sm_count: int = 0,
        copy_v: bool = False,
    ):
        self.lib = lib
        # copy_v (the tuner's launches): V with its keys contiguous goes in place to a kernel
        # that reads it so, any other kernel reads a copy with the head dim contiguous, made on
        # every call, as fact::attention makes it (so the copy is timed with the kernel).
        # Without copy_v the kernel gets V as it is, and refuses what it cannot read.
        self.v_source = None
        if copy_v and v_keys_contiguous(v) and not lib.info.get("v_keys_contiguous"):
            self.v_source, v = v, v.contiguous()
        self.args = args_for(q, k, v, o, scale, sm_count)
        self.tensors = (q, k, v, o)  # alive while the kernel may run
        nbytes = lib.attention_workspace_size(self.args)
        if workspace is None:
            workspace = torch.empty(nbytes, dtype=torch.uint8, device=q.device) if nbytes else None
        elif workspace.numel() * workspace.element_size() < nbytes:
            raise FactError(
                f"kernel {lib.name}: workspace of {workspace.numel() * workspace.element_size()} "
                f"bytes, it needs {nbytes}"
            )
        self.workspace = workspace
        self.ptr = workspace.data_ptr() if workspace is not None else None
        self.nbytes = workspace.numel() * workspace.element_size() if workspace is not None else 0
        self.stream = _stream_ptr(q.device)
        self.failed: list[int] = []

    def can_implement(self) -> tuple[int, str]:
        status = self.lib.attention_can_implement(self.args)
        return status, self.lib.last_error() if status != Status.OK else ""

    def __call__(self) -> None:
        if self.v_source is not None:
            self.tensors[2].copy_(self.v_source)
        status = self.lib.attention_run(self.args, self.ptr, self.nbytes, self.stream)
        if status != Status.OK:
            self.failed.append(status)

    def check(self) -> None:
        """Raise for the first failed launch: KernelFault for a CUDA error (the context may be
        gone), KernelStatusError naming the kernel and its fact_last_error otherwise."""
        if not self.failed:
            return
        status = self.failed[0]
        message = self.lib.last_error()
        if status == Status.CUDA_ERROR:
            raise harness.KernelFault(f"kernel {self.lib.name}: CUDA error: {message}")
        raise KernelStatusError(status, message, f"kernel {self.lib.name} ({self.lib.path})")


def run_kernel(
    lib: KernelLibrary | str | os.PathLike[str],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    spec: AttentionSpec | Mapping[str, Any],
    workspace: torch.Tensor | None = None,
    *,
    sm_count: int = 0,
) -> None:
    """Run an attention kernel once on torch's current stream (asynchronous on a GPU): o =
    attention(q, k, v) with the spec's causal mask and scale. The workspace the kernel asks for
    is allocated with torch unless one (a byte tensor, large enough) is given. Raises
    KernelStatusError (naming the kernel, with its fact_last_error) on a status other than OK,
    KernelFault on a CUDA error."""
    lib = lib if isinstance(lib, KernelLibrary) else KernelLibrary(lib)
    if not isinstance(spec, AttentionSpec):
        spec = AttentionSpec.from_pattern(spec)
    with harness.device_guard(q.device):
        launch = _Launch(lib, q, k, v, o, spec.scale, workspace, sm_count)
        launch()
    launch.check()


# ---------------------------------------------------------------------------------------------
# Verification and timing


def _shapes(spec: AttentionSpec, shapes: Sequence[Mapping[str, Any]] | None) -> list[AttentionSpec]:
    """The specs to verify on: the problem itself, then each of `shapes` (partial sizes on top
    of it) that differs from it."""
    out = [spec]
    for s in shapes or ():
        extra = spec.with_problem(s)
        if extra.problem not in [x.problem for x in out]:
            out.append(extra)
    return out


def _max_rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max|out - ref| / max|ref| (a second view of the error, recorded beside rel_err)."""
    diff = (out.to(ref.dtype) - ref).abs().max()
    den = float(ref.abs().max())
    return float(diff) / den if den > 0 else float(diff)


def _check(
    lib: KernelLibrary | None,
    spec: AttentionSpec,
    dev: torch.device,
    tol: float,
    result: dict[str, Any],
    first: bool,
    failures: list[str],
) -> tuple[AttentionInputs, torch.Tensor] | None:
    """Run one shape (the kernel, or PyTorch when lib is None) and record its error. Returns the
    inputs and reference (for timing on the same data), or None when the shape was not run."""
    label = spec.label
    inputs = make_inputs(spec, dev)
    if lib is not None:
        launch = _Launch(lib, inputs.q, inputs.k, inputs.v, inputs.o, spec.scale, copy_v=True)
        status, why = launch.can_implement()
        if status == Status.OK:
            launch()
            harness._sync(dev)
            if launch.failed:
                status, why = launch.failed[0], lib.last_error()
        if status == Status.CUDA_ERROR:
            raise harness.KernelFault(f"kernel {lib.name}: CUDA error: {why}")
        if status != Status.OK:
            text = f"{label}: {status_name(status)}: {why}"
            if not first and status in (Status.NOT_SUPPORTED, Status.INVALID_ARGS):
                result["skipped"][label] = text
                return None
            disposition = "fault" if status == Status.WORKSPACE_TOO_SMALL else "not_supported"
            result.update(disposition=disposition, message=text)
            raise _Stop
    else:
        pytorch_attention(spec, inputs.q, inputs.k, inputs.v, inputs.o)
        harness._sync(dev)
    ref = reference(spec, inputs.q, inputs.k, inputs.v)
    err, why = harness.rel_err(inputs.o, ref)
    if math.isfinite(err):
        result["max_rel_err"][label] = _max_rel_err(inputs.o, ref)
    harness.record_error(result, failures, label, err, why, inputs.seed, tol, baseline=lib is None)
    return inputs, ref


class _Stop(Exception):
    """The first shape could not run: the result says why."""


def _verify(
    lib: KernelLibrary | None,
    spec: AttentionSpec,
    precision: str,
    shapes: Sequence[Mapping[str, Any]] | None,
    dev: torch.device,
) -> tuple[dict[str, Any], tuple[AttentionInputs, torch.Tensor] | None]:
    tol = harness.tolerance(spec, precision)
    result = harness._check_result(tol, ok=lib is None)
    result["max_rel_err"] = {}
    kept = None
    failures: list[str] = []
    if lib is not None:
        mismatch = check_kernel_info(lib.info, spec, precision)
        if lib.family != FAMILY:
            mismatch = [f"a {lib.family} kernel library, not an attention kernel"]
        if mismatch:
            result.update(
                disposition="not_supported",
                message="kernel does not fit the pattern: " + "; ".join(mismatch),
            )
            return result, None
    for i, shape in enumerate(_shapes(spec, shapes)):
        try:
            got = _check(lib, shape, dev, tol, result, i == 0, failures)
        except _Stop:
            return result, None
        if i == 0:
            kept = got
        else:
            del got
    if lib is None:
        result["message"] = "; ".join(failures)
        return result, kept
    return harness.settle(result, failures), kept


def verify_attention(
    lib: KernelLibrary | str | os.PathLike[str],
    pattern: AttentionSpec | Mapping[str, Any],
    problem: Mapping[str, Any] | None = None,
    precision: str = "highest",
    shapes: Sequence[Mapping[str, Any]] | None = None,
    *,
    device: Any = "cuda",
) -> dict[str, Any]:
    """Check one attention kernel against the reference on fresh random inputs: the problem,
    then `shapes` (partial sizes on top of it; ones the kernel cannot implement are skipped).

    Returns harness.verify's record ({ok, disposition, rel_err, seeds, skipped, tolerance,
    message}) plus max_rel_err {label: max|out - ref| / max|ref|}. Raises KernelFault.
    """
    lib = lib if isinstance(lib, KernelLibrary) else KernelLibrary(lib)
    result, _ = _verify(lib, _spec(pattern, problem), precision, shapes, torch.device(device))
    return result


def _timed(
    fn: Callable[[], None], *, reps: int, warmup: int, flush: bool, dev: torch.device
) -> float:
    return statistics.median(harness.time_fn(fn, reps=reps, warmup=warmup, flush=flush, device=dev))


def evaluate_attention_kernel(
    candidate: Mapping[str, Any],
    pattern: AttentionSpec | Mapping[str, Any],
    *,
    arch: str = "sm90",
    precision: str = "highest",
    problem: Mapping[str, Any] | None = None,
    shapes: Sequence[Mapping[str, Any]] | None = None,
    knobs_list: Sequence[Mapping[str, Any]] | None = None,
    reps: int = harness.MIN_REPS,
    warmup: int = harness.DEFAULT_WARMUP,
    flush: bool = True,
    device: Any = "cuda",
    on_load: Callable[[str, Mapping[str, Any]], None] | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Verify then time one attention kernel ({kernel, library, config}); returns its row
    (harness.make_row): disposition passed | incorrect | not_supported, error = the largest
    rel_err over the checked shapes (and the output of the last timed rep), time_us = the median
    of `reps` launches at the problem, L2 flushed before each (harness.time_fn).

    knobs_list is accepted for the harness's sake and ignored: attention kernels have no launch
    knobs. on_load(kernel, config) is called once the library is loaded, on_progress("verified")
    after the verification. Raises KernelFault.
    """
    del knobs_list
    spec = _spec(pattern, problem)
    plan_pattern = pattern if isinstance(pattern, Mapping) else {"signature": spec.signature}
    lib, row = harness.open_candidate(
        candidate, dict(pattern=plan_pattern, arch=arch, problem=spec.problem), on_load
    )
    if lib is None:
        return row
    dev = torch.device(device)
    v, kept = _verify(lib, spec, precision, shapes, dev)
    if on_progress:
        on_progress("verified")
    errors = [e for e in v["rel_err"].values() if not math.isnan(e)]
    if not v["ok"] or kept is None:
        return harness.make_row(
            **row,
            disposition=v["disposition"],
            error=max(errors) if errors else None,
            message=v["message"],
            verify=v,
        )
    inputs, ref = kept
    inputs.poison()
    launch = _Launch(lib, inputs.q, inputs.k, inputs.v, inputs.o, spec.scale, copy_v=True)
    time_us = _timed(launch, reps=reps, warmup=warmup, flush=flush, dev=dev)
    harness._sync(dev)
    try:
        launch.check()
    except KernelStatusError as exc:
        return harness.make_row(
            **row,
            disposition="not_supported",
            error=max(errors),
            message=f"timing: {exc}",
            verify=v,
        )
    err, why = harness.rel_err(inputs.o, ref)  # the last timed rep's output
    errors.append(err)
    if not err <= v["tolerance"]:
        return harness.make_row(
            **row,
            disposition="incorrect",
            error=max(errors),
            message=f"timed runs: rel_err {err:.3g} > {v['tolerance']:g} (seed {inputs.seed})"
            + (f": {why}" if why else ""),
            verify=v,
        )
    return harness.make_row(
        **row,
        disposition="passed",
        time_us=time_us,
        error=max(errors),
        knobs={},
        message=v["message"],
        verify=v,
    )


def evaluate_attention_pytorch(
    pattern: AttentionSpec | Mapping[str, Any],
    *,
    arch: str = "sm90",
    precision: str = "highest",
    problem: Mapping[str, Any] | None = None,
    shapes: Sequence[Mapping[str, Any]] | None = None,
    reps: int = harness.MIN_REPS,
    warmup: int = harness.DEFAULT_WARMUP,
    flush: bool = True,
    device: Any = "cuda",
    on_progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The PyTorch candidate's row (kernel harness.PYTORCH): scaled_dot_product_attention on the
    same inputs, verified like a kernel (it is the baseline: an error above the kernels'
    tolerance is noted, only a non-finite output fails it), then timed the same way, followed
    by the model's own layout step (transpose(1, 2).contiguous() for bs(hd), contiguous() for
    bhsd), which copies only where SDPA's output is not laid out that way already.
    on_progress("verified") between verification and timing."""
    spec = _spec(pattern, problem)
    plan_pattern = pattern if isinstance(pattern, Mapping) else {"signature": spec.signature}
    dev = torch.device(device)
    v, kept = _verify(None, spec, precision, shapes, dev)
    if on_progress:
        on_progress("verified")
    row = dict(
        pattern=plan_pattern,
        arch=arch,
        problem=spec.problem,
        kernel=harness.PYTORCH,
        library=None,
        config={"name": harness.PYTORCH},
        verify=v,
    )
    finite = [e for e in v["rel_err"].values() if math.isfinite(e)]
    error = max(finite) if finite else None
    if not v["ok"] or kept is None:
        return harness.make_row(
            **row, disposition=v["disposition"], error=error, message=v["message"]
        )
    inputs, _ = kept

    def launch() -> None:
        # what the model does after the attention: a copy only where SDPA's output layout is
        # not already the pattern's (flash writes (B, S, H, D), so bs(hd) costs nothing)
        y = pytorch_attention(spec, inputs.q, inputs.k, inputs.v)
        if spec.out_layout == "bhsd":
            y.contiguous()
        else:
            y.transpose(1, 2).contiguous()

    time_us = _timed(launch, reps=reps, warmup=warmup, flush=flush, dev=dev)
    return harness.make_row(
        **row, disposition="passed", time_us=time_us, error=error, message=v["message"]
    )
