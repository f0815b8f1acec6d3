"""`fact::gemm`, `fact::gemm_parts`, `fact::norm`, `fact::norm_stats`, `fact::attention` and
`fact::pointwise`, the torch custom ops through which a composed module calls generated kernels.

The op is registered with torch.library, so the composed module traces under torch.compile,
export and fake tensors, and records into CUDA graphs: it allocates its output (and any
workspace) from PyTorch's caching allocator and launches on PyTorch's current stream through the
kernel's C ABI (engine/families/gemm/fact_gemm_abi.h; fact_norm_abi.h, fact_attention_abi.h and
fact_pointwise_abi.h for the other families). Run eagerly on real tensors, a composed module
calls each op's Python body directly (BODIES, impls.direct_calls), skipping the dispatcher.

A kernel is named in the graph by an integer handle into this process's kernel table; the entry
holds the loaded library, the pattern's GEMM spec (layouts, epilogue operands) and the launch
knobs tuning picked. Entries with backend "reference" compute the same function with PyTorch ops
(matmul, then the epilogue expression; the attention math; a pointwise region's expression): the
composer's tests use them where there is no GPU.

GEMM (sm90 template), norm and pointwise kernels launch as programmatic dependents of the
stream's previous kernel (CUDA's PDL, `dependent_launches`): a kernel's blocks start while its
predecessor finishes and wait for it before touching memory, which hides the launch and set-up
between kernels. Attention kernels, horizontally fused GEMMs and GEMMs with a scalar operand
launch plainly (docs/kernels.md, "Launches").
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fact.errors import FactError
from fact.tune.abi import (
    FACT_POINTWISE_MAX_INPUTS,
    FACT_POINTWISE_MAX_RANK,
    FactGemmArgs,
    FactNormArgs,
    FactPointwiseArgs,
    KernelLibrary,
    KernelStatusError,
    Status,
    nondeterministic,
)
from fact.tune.harness import device_guard
from fact.tune.inputs import GemmInputs, gemm_args, leading_dim, set_knobs, set_parts
from fact.tune.reference import GemmSpec, eval_pointwise, pytorch_candidate, torch_dtype

BACKENDS = ("cutlass", "reference")


@dataclass
class GemmKernel:
    """One entry of the kernel table."""

    spec: GemmSpec
    backend: str  # cutlass | reference
    library: KernelLibrary | None = None
    knobs: dict[str, Any] = field(default_factory=dict)
    label: str = ""
    # packed launches per call layout (PreparedGemm), for a composed module's direct calls
    prepared: dict[tuple, Any] = field(default_factory=dict, repr=False)

    @property
    def out_dtype(self) -> torch.dtype:
        return torch_dtype(self.spec.dtype_out)


@dataclass
class NormKernel:
    """A row-norm kernel (abi/fact_norm_abi.h), or its PyTorch twin (backend reference)."""

    kind: str  # layer_norm | rms_norm
    cols: int
    eps: float
    out_dtype: torch.dtype
    backend: str  # cutlass (a generated library) | reference
    library: KernelLibrary | None = None
    round_to: torch.dtype | None = None  # the model's cast before * weight (.type_as(x))
    label: str = ""
    prepared: dict[tuple, Any] = field(default_factory=dict, repr=False)  # PreparedNorm


@dataclass
class AttentionKernel:
    """A fused attention kernel, forward (abi/fact_attention_abi.h: CUTLASS's Hopper FMHA, also
    in TF32 for f32, or its sm80 kernel for f32), or its PyTorch twin (backend reference):
    softmax(scale * Q K^T (+ causal mask)) V."""

    causal: bool  # top-left aligned, as PyTorch's is_causal
    scale: float
    out_dtype: torch.dtype
    backend: str  # cutlass (a generated library) | reference
    library: KernelLibrary | None = None
    label: str = ""
    # bs(hd): the output is merged into (batch, seq, heads*dim) next, so it is written as the
    # transpose of a (B, S, H, D) buffer; bhsd: the model keeps (B, H, S, D), written contiguous
    out_layout: str = "bs(hd)"


@dataclass
class PointwiseKernel:
    """A generated pointwise kernel (abi/fact_pointwise_abi.h: a region of elementwise ops, with
    broadcasting and slices and concatenations along the last dim, in one pass), or its PyTorch
    twin (backend reference), which evaluates the region's SSA."""

    ssa: list[dict[str, Any]]  # the plan's epilogue_expr.ssa: operands and constants, no acc
    inputs: list[torch.dtype]  # what the kernel reads, in0 .. inN-1 in order
    out_dtype: torch.dtype
    cols: int  # the output's last dim
    backend: str  # cutlass (a generated library) | reference
    library: KernelLibrary | None = None
    label: str = ""
    # each input's last dim as traced (None: unchecked); the kernel reads that many columns
    input_cols: list[int] | None = None
    # packed args per (output, inputs) layout, pointers left to fill: a module calls the kernel
    # with the same layouts every time, so each call only writes its data pointers
    layouts: dict[tuple, FactPointwiseArgs] = field(default_factory=dict, repr=False)


KernelEntry = GemmKernel | NormKernel | AttentionKernel | PointwiseKernel
_TABLE: list[KernelEntry] = []
_LOCK = threading.Lock()
_SM_COUNT: dict[int, int] = {}


def register_kernel(entry: KernelEntry) -> int:
    """Add a kernel to the table; returns its handle (the `kernel` argument of fact::gemm)."""
    if entry.backend not in BACKENDS:
        raise FactError(f"kernel backend {entry.backend!r} is not one of {BACKENDS}")
    if entry.backend == "cutlass" and entry.library is None:
        raise FactError("a cutlass kernel entry needs its loaded library")
    with _LOCK:
        _TABLE.append(entry)
        return len(_TABLE) - 1


def kernel_entry(handle: int) -> Any:
    if not 0 <= handle < len(_TABLE):
        raise FactError(f"fact kernel table: no kernel with handle {handle} in this process")
    return _TABLE[handle]


#: Whether kernels launch as programmatic dependents (FactGemmArgs.pdl): on unless the
#: environment says FACT_PDL=0 (or false, off, no) at import; `dependent_launches` switches it
#: for a block of calls.
_DEPENDENT = contextvars.ContextVar(
    "fact_dependent_launches",
    default=os.environ.get("FACT_PDL", "1").strip().lower() not in ("0", "false", "off", "no"),
)


@contextlib.contextmanager
def dependent_launches(enabled: bool) -> Iterator[None]:
    """Launch the kernels called within as programmatic dependents of the stream's previous
    kernel (True) or plainly (False). The results are the same either way; a CUDA graph
    captures the launches as they were made."""
    token = _DEPENDENT.set(bool(enabled))
    try:
        yield
    finally:
        _DEPENDENT.reset(token)


def dependent_launches_enabled() -> bool:
    return _DEPENDENT.get()


def _sm_count(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def _launch(run, args, nbytes: int, device: torch.device) -> int:
    """run(args, workspace, nbytes, stream), a kernel's ABI entry point, on PyTorch's current
    stream with the workspace it asked for taken from the caching allocator; its status."""
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes else None
    return run(args, workspace.data_ptr() if nbytes else None, nbytes, current_stream(device))


def current_stream(device: torch.device) -> int:
    """The raw handle of PyTorch's current stream on `device` (the launch's stream)."""
    if _RAW_STREAM is None:
        return torch.cuda.current_stream(device).cuda_stream
    return _RAW_STREAM(device.index if device.index is not None else torch.cuda.current_device())


# The handle without building a Stream object (what torch.compile's generated code calls);
# private, so only where this torch has it.
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)
# The current device's index without torch.cuda's lazy-init check, for prepared launches (CUDA
# is up: their tensors are on it).
_RAW_DEVICE = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def _problem(a: torch.Tensor, b: torch.Tensor) -> dict[str, int]:
    batch = a.shape[0] if a.dim() == 3 else 1
    return {"batch": batch, "m": a.shape[-2], "n": b.shape[-1], "k": a.shape[-1]}


def _check_dtypes(label: str, pairs) -> None:
    """The kernel reads raw bits: a tensor of another dtype or device would be misread."""
    for name, t, dtype in pairs:
        if t.dtype != dtype or not t.is_cuda:
            raise FactError(
                f"{label}: {name} is {t.dtype} on {t.device}, the kernel reads {dtype} on CUDA"
            )


def launch_knobs(knobs: dict[str, Any]) -> dict[str, Any]:
    """The tuned knobs, or while PyTorch's deterministic algorithms are on and they ask for the
    atomic stream-K reduction (tuned while nondeterminism was allowed), the ordered reduction
    without a split-K factor: one chosen for atomic adds would serialise its peers. A tuned
    decomposition stays (with the ordered reduction it gives the same bits every run too). The
    decision cache and CUDA graph keys include the switch, so optimize and replay see what
    runs."""
    if nondeterministic(knobs) and torch.are_deterministic_algorithms_enabled():
        return {**knobs, "splits": 1, "reduction": "deterministic"}
    return knobs


def _check_gemm_dtypes(entry: GemmKernel, a, b, operands) -> None:
    spec = entry.spec
    _check_dtypes(
        entry.label or (entry.library.name if entry.library is not None else "reference"),
        [("A", a, torch_dtype(spec.dtype_a)), ("B", b, torch_dtype(spec.dtype_b))]
        + [
            (f"operand {o.index}", t, torch_dtype(o.dtype))
            for t, o in zip(operands, spec.operands, strict=True)
        ],
    )


def _run_cutlass(entry: GemmKernel, a, b, operands, out) -> None:
    lib = entry.library
    assert lib is not None
    _check_gemm_dtypes(entry, a, b, operands)
    inputs = GemmInputs(entry.spec, _problem(a, b), a, b, list(operands), out, 0, a.device)
    args = gemm_args(inputs, launch_knobs(entry.knobs), _sm_count(a.device))
    what = f"fact::gemm {entry.label or lib.name}: the kernel cannot run"
    _run_gemm_args(lib, args, a.device, f"{what} {tuple(a.shape)} @ {tuple(b.shape)}")


def _run_gemm_args(
    lib: KernelLibrary, args: FactGemmArgs, device: torch.device, refusal: str
) -> None:
    """can_implement, then run with the workspace the kernel asks for on PyTorch's current
    stream; FactError `refusal: <the kernel's reason>` when it cannot implement the call."""
    if lib.can_implement(args) != Status.OK:
        raise FactError(f"{refusal}: {lib.last_error()}")
    args.pdl = int(_DEPENDENT.get())
    lib.check(_launch(lib.run, args, lib.workspace_size(args), device))


def _gemm(
    a: torch.Tensor, b: torch.Tensor, operands: list[torch.Tensor], kernel: int
) -> torch.Tensor:
    """D = epilogue(A @ B, operands) by kernel `kernel` of the table.

    a [m, k] or [batch, m, k] and b [k, n] or [batch, k, n] in the kernel's layouts (row- or
    column-major views); operands in the kernel's layout: row [n] / [batch, n], col [m] /
    [batch, m], scalar [1], full [m, n] / [batch, m, n] row-major. Returns a new tensor.
    """
    entry = kernel_entry(kernel)
    if entry.backend == "reference":
        return pytorch_candidate(entry.spec, a, b, list(operands))
    lead = (a.shape[0],) if a.dim() == 3 else ()
    out = torch.empty((*lead, a.shape[-2], b.shape[-1]), dtype=entry.out_dtype, device=a.device)
    with device_guard(a.device):
        _run_cutlass(entry, a, b, operands, out)
    return out


gemm = torch.library.custom_op("fact::gemm", _gemm, mutates_args=())


@gemm.register_fake
def _gemm_fake(a, b, operands, kernel):
    entry = kernel_entry(kernel)
    lead = (a.shape[0],) if a.dim() == 3 else ()
    return a.new_empty((*lead, a.shape[-2], b.shape[-1]), dtype=entry.out_dtype)


# ---------------------------------------------------------------------------------------------
# Prepared launches: what a composed module's direct calls pay per call
#
# A call site of a composed module calls its kernel with the same layouts every time; only the
# data pointers change. So the first call with a layout packs the kernel's arguments (and asks
# can_implement and the workspace size once), and every later call with that layout writes its
# pointers into a copy and launches. The layout key holds everything the packed arguments and
# can_implement depend on but the pointers (shapes, strides, dtypes, device; the deterministic
# switch where the knobs depend on it); pointers must be 16-byte aligned, as they were when
# can_implement said yes, or the call takes the checked path.

MAX_PREPARED = 64  # layouts kept per kernel; a caller cycling through more starts over
_UNSEEN = object()


def prepared_launch(cache: dict, layout: tuple, prepare: Callable[[], Any], *tensors) -> Any:
    """Launch through the packed arguments of `layout`, packing them (prepare()) the first time
    it is seen; None where the layout has none or this call's pointers do not fit them: the
    caller then takes its checked path."""
    prepared = cache.get(layout, _UNSEEN)
    if prepared is _UNSEEN:
        if len(cache) >= MAX_PREPARED:
            cache.clear()
        prepared = cache[layout] = prepare()
    return prepared.launch(*tensors) if prepared is not None else None


def gemm_call_key(entry: GemmKernel, a: torch.Tensor, b: torch.Tensor, operands) -> tuple:
    key = (
        a.shape,
        a.stride(),
        a.dtype,
        b.shape,
        b.stride(),
        b.dtype,
        a.device,
        tuple((t.shape, t.stride(), t.dtype) for t in operands),
    )
    if entry.knobs and nondeterministic(entry.knobs):
        return (*key, torch.are_deterministic_algorithms_enabled())
    return key


@dataclass
class PreparedGemm:
    """A GEMM kernel's packed arguments for one call layout (see above)."""

    args: FactGemmArgs
    out_shape: tuple[int, ...]
    out_dtype: torch.dtype
    device: torch.device
    workspace: int
    lib: KernelLibrary

    def launch(self, a: torch.Tensor, b: torch.Tensor, operands) -> torch.Tensor | None:
        """D for these tensors, launched; None when a pointer is not 16-byte aligned (then
        the checked path runs the call)."""
        pa, pb = a.data_ptr(), b.data_ptr()
        ptrs = [t.data_ptr() for t in operands]
        aligned = pa | pb
        for p in ptrs:
            aligned |= p
        if aligned & 15 or (self.device.index or 0) != _RAW_DEVICE():
            return None
        out = torch.empty(self.out_shape, dtype=self.out_dtype, device=self.device)
        args = FactGemmArgs.from_buffer_copy(self.args)
        args.a, args.b, args.d = pa, pb, out.data_ptr()
        for i, p in enumerate(ptrs):
            args.operands[i] = p
        args.pdl = int(_DEPENDENT.get())
        self.lib.check(_launch(self.lib.run, args, self.workspace, self.device))
        return out


def prepare_gemm(
    entry: GemmKernel,
    views: tuple[torch.Tensor, torch.Tensor, Sequence[torch.Tensor]],
    sources: tuple[torch.Tensor, torch.Tensor, Sequence[torch.Tensor]],
    out_shape: Sequence[int],
) -> PreparedGemm | None:
    """Pack the arguments of `entry`'s kernel for the views (A, B, operands in the kernel's
    layouts) of the call's tensors `sources`, where every view starts where its source does (no
    copy between them, so the sources' pointers are the kernel's), and the kernel can implement
    the call. None otherwise: the call site then takes the checked path every time."""
    A, B, ops_ = views
    a, b, operands = sources
    lib = entry.library
    if lib is None or len(ops_) != len(operands):
        return None
    pairs = [(A, a), (B, b), *zip(ops_, operands, strict=True)]
    if any(v.data_ptr() != s.data_ptr() or s.data_ptr() % 16 for v, s in pairs):
        return None
    _check_gemm_dtypes(entry, A, B, ops_)
    lead = (A.shape[0],) if A.dim() == 3 else ()
    d = torch.empty((*lead, A.shape[-2], B.shape[-1]), dtype=entry.out_dtype, device=A.device)
    if d.numel() != math.prod(out_shape):
        return None
    inputs = GemmInputs(entry.spec, _problem(A, B), A, B, list(ops_), d, 0, A.device)
    with device_guard(A.device):
        args = gemm_args(inputs, launch_knobs(entry.knobs), _sm_count(A.device))
        if lib.can_implement(args) != Status.OK:
            return None
        workspace = lib.workspace_size(args)
    return PreparedGemm(args, tuple(out_shape), entry.out_dtype, A.device, workspace, lib)


# ---------------------------------------------------------------------------------------------
# Horizontal GEMMs: several linear layers reading one input, in one launch


def _parts_checks(label: str, entry: GemmKernel, a, weights, biases) -> None:
    """a [m, k]; weights[p] [n_p, k]; biases one per part, each [n_p] or None, and only where
    the kernel adds biases (a kernel without the bias epilogue would drop them)."""
    if entry.spec.family != "horizontal_gemm":
        raise FactError(f"fact::gemm_parts {label}: a {entry.spec.family} kernel has no parts")
    if a.dim() != 2 or not weights or len(biases) != len(weights):
        raise FactError(
            f"fact::gemm_parts {label}: a must be [m, k] with one bias (or None) per weight, got "
            f"a {tuple(a.shape)}, {len(weights)} weights and {len(biases)} biases"
        )
    k = a.shape[1]
    for p, (w, bias) in enumerate(zip(weights, biases, strict=True)):
        if w.dim() != 2 or w.shape[1] != k:
            raise FactError(
                f"fact::gemm_parts {label}: weight {p} is {tuple(w.shape)}, not [n, {k}] for a "
                f"{tuple(a.shape)}"
            )
        if bias is not None and tuple(bias.shape) != (w.shape[0],):
            raise FactError(
                f"fact::gemm_parts {label}: bias {p} is {tuple(bias.shape)}, not [{w.shape[0]}]"
            )
    if not entry.spec.operands and any(b is not None for b in biases):
        raise FactError(f"fact::gemm_parts {label}: the kernel adds no bias, but biases were given")


def _run_cutlass_parts(entry: GemmKernel, a, weights, biases, outs) -> None:
    lib = entry.library
    assert lib is not None
    spec = entry.spec
    label = entry.label or lib.name
    bias_dtype = torch_dtype(spec.operands[0].dtype) if spec.operands else None
    _check_dtypes(
        f"fact::gemm_parts {label}",
        [("A", a, torch_dtype(spec.dtype_a))]
        + [(f"weight {p}", w, torch_dtype(spec.dtype_b)) for p, w in enumerate(weights)]
        + [(f"bias {p}", b, bias_dtype) for p, b in enumerate(biases) if b is not None],
    )
    biases = [b.contiguous() if b is not None else None for b in biases]  # kept alive here
    args = FactGemmArgs()
    args.m, args.k, args.batch = a.shape[0], a.shape[1], 1
    args.a, args.batch_stride_a = a.data_ptr(), a.shape[0] * a.shape[1]
    # Each part reads its Linear weight in place: B_p [k, n_p] = W_p^T, column-major for a
    # row-major weight; the kernel's layouts are checked, nothing is copied into them.
    parts = [(w.t(), d, b) for w, d, b in zip(weights, outs, biases, strict=True)]
    try:
        args.lda = leading_dim(a, spec.layout_a, "A")
        set_parts(args, parts, spec.layout_b)
    except FactError as exc:
        raise FactError(f"fact::gemm_parts {label}: {exc}") from None
    set_knobs(args, launch_knobs(entry.knobs), _sm_count(a.device))
    shapes = ", ".join(str(tuple(w.shape)) for w in weights)
    refusal = f"fact::gemm_parts {label}: the kernel cannot run {tuple(a.shape)} against weights"
    _run_gemm_args(lib, args, a.device, f"{refusal} {shapes}")


def _gemm_parts(
    a: torch.Tensor,
    weights: list[torch.Tensor],
    biases: list[torch.Tensor | None],
    kernel: int,
) -> list[torch.Tensor]:
    """D_p = A @ W_p^T (+ bias_p) for every part p, by horizontal GEMM kernel `kernel` of the
    table: several linear layers on one input in one launch, each writing its own output.

    a [m, k] (row-major for a generated kernel); weights[p] [n_p, k], Linear weights read in
    place (no concatenated copy, so an in-place update is seen by the next call); biases one per
    part, [n_p] or None. Returns a new [m, n_p] tensor per part.
    """
    entry = kernel_entry(kernel)
    if not isinstance(entry, GemmKernel):
        raise FactError(f"fact::gemm_parts: kernel {kernel} is not a GEMM kernel")
    label = entry.label or (entry.library.name if entry.library is not None else "reference")
    _parts_checks(label, entry, a, weights, biases)
    if entry.backend == "reference":  # as the model ran: one matmul (+ bias) per part
        outs = []
        for w, bias in zip(weights, biases, strict=True):
            acc = torch.matmul(a, w.t())
            outs.append((acc + bias if bias is not None else acc).to(entry.out_dtype))
        return outs
    m = a.shape[0]
    outs = [torch.empty((m, w.shape[0]), dtype=entry.out_dtype, device=a.device) for w in weights]
    with device_guard(a.device):
        _run_cutlass_parts(entry, a, weights, biases, outs)
    return outs


gemm_parts = torch.library.custom_op("fact::gemm_parts", _gemm_parts, mutates_args=())


@gemm_parts.register_fake
def _gemm_parts_fake(a, weights, biases, kernel):
    entry = kernel_entry(kernel)
    return [a.new_empty((a.shape[0], w.shape[0]), dtype=entry.out_dtype) for w in weights]


def _norm_reference(entry: NormKernel, x, weight, bias) -> torch.Tensor:
    xf = x.float()
    if entry.kind == "rms_norm":
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + entry.eps)
    else:
        y = torch.nn.functional.layer_norm(xf, (entry.cols,), eps=entry.eps)
    if entry.round_to is not None:
        y = y.to(entry.round_to).float()
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(entry.out_dtype)


def _check_norm_dtypes(entry: NormKernel, x, weight, bias) -> None:
    lib = entry.library
    wanted = torch_dtype(lib.info.get("dtype_in", "f32"))
    weights = [(n, t) for n, t in (("weight", weight), ("bias", bias)) if t is not None]
    w_dtype = lib.info.get("dtype_weight") or "f32"
    _check_dtypes(
        entry.label,
        [("x", x, wanted)] + [(n, t, torch_dtype(w_dtype)) for n, t in weights],
    )


def _norm_args(entry: NormKernel, x: torch.Tensor) -> tuple[torch.Tensor, FactNormArgs]:
    """x as rows of `entry.cols` (a copy only when its last dim is strided) and the kernel's
    arguments for them; the caller fills in what it writes."""
    x2 = x.reshape(-1, entry.cols)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    args = FactNormArgs()
    args.rows, args.cols = x2.shape[0], entry.cols
    args.x, args.ldx, args.eps = x2.data_ptr(), x2.stride(0), entry.eps
    return x2, args


def _run_norm(entry: NormKernel, op: str, args: FactNormArgs, device: torch.device) -> None:
    lib = entry.library
    status = lib.norm_can_implement(args)
    if status != Status.OK:
        raise FactError(f"{op} {entry.label}: {lib.last_error()}")
    args.pdl = int(_DEPENDENT.get())
    with device_guard(device):
        lib.check(lib.norm_run(args, current_stream(device)))


@dataclass
class PreparedNorm:
    """A row-norm kernel's packed arguments for one call layout (see PreparedGemm): x read in
    place as rows, weight and bias contiguous."""

    args: FactNormArgs
    device: torch.device
    lib: KernelLibrary
    out_dtype: torch.dtype

    def launch(self, x: torch.Tensor, weight, bias) -> torch.Tensor | None:
        px = x.data_ptr()
        pw = weight.data_ptr() if weight is not None else 0
        pb = bias.data_ptr() if bias is not None else 0
        if (px | pw | pb) & 15 or (self.device.index or 0) != _RAW_DEVICE():
            return None
        out = torch.empty(x.shape, dtype=self.out_dtype, device=self.device)
        args = FactNormArgs.from_buffer_copy(self.args)
        args.x, args.out = px, out.data_ptr()
        args.weight, args.bias = pw or None, pb or None
        args.pdl = int(_DEPENDENT.get())
        self.lib.check(self.lib.norm_run(args, current_stream(self.device)))
        return out


def _prepare_norm(entry: NormKernel, x, weight, bias) -> PreparedNorm | None:
    """PreparedNorm for a call whose rows, weight and bias the kernel reads in place, and that
    the kernel can implement; None otherwise (the checked path runs such calls). FactError for
    tensors of other dtypes than the kernel's, which are in the layout."""
    _check_norm_dtypes(entry, x, weight, bias)
    lib = entry.library
    if x.dim() == 0 or x.shape[-1] != entry.cols or x.stride(-1) != 1 or x.numel() == 0:
        return None
    if any(t is not None and not t.is_contiguous() for t in (weight, bias)):
        return None
    x2 = x.reshape(-1, entry.cols)
    if x2.data_ptr() != x.data_ptr() or any(
        t is not None and t.data_ptr() % 16 for t in (x, weight, bias)
    ):
        return None
    _, args = _norm_args(entry, x)
    args.weight = weight.data_ptr() if weight is not None else None
    args.bias = bias.data_ptr() if bias is not None else None
    out = torch.empty(x.shape, dtype=entry.out_dtype, device=x.device)
    args.out, args.ldout = out.data_ptr(), entry.cols
    if lib.norm_can_implement(args) != Status.OK:
        return None
    return PreparedNorm(args, x.device, lib, entry.out_dtype)


def _norm(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, kernel: int
) -> torch.Tensor:
    """out = norm(x) over the last dim (* weight) (+ bias) by row-norm kernel `kernel`."""
    entry = kernel_entry(kernel)
    if entry.backend == "reference":
        return _norm_reference(entry, x, weight, bias)
    layout = (
        x.shape,
        x.stride(),
        x.dtype,
        x.device,
        None if weight is None else (weight.shape, weight.stride(), weight.dtype),
        None if bias is None else (bias.shape, bias.stride(), bias.dtype),
    )
    prepare = lambda: _prepare_norm(entry, x, weight, bias)  # noqa: E731
    out = prepared_launch(entry.prepared, layout, prepare, x, weight, bias)
    if out is not None:
        return out
    _check_norm_dtypes(entry, x, weight, bias)
    x2, args = _norm_args(entry, x)
    out = torch.empty(x.shape, dtype=entry.out_dtype, device=x.device)
    args.weight = weight.contiguous().data_ptr() if weight is not None else None
    args.bias = bias.contiguous().data_ptr() if bias is not None else None
    args.out, args.ldout = out.data_ptr(), entry.cols
    _run_norm(entry, "fact::norm", args, x.device)
    return out


norm = torch.library.custom_op("fact::norm", _norm, mutates_args=())


@norm.register_fake
def _norm_fake(x, weight, bias, kernel):
    return x.new_empty(x.shape, dtype=kernel_entry(kernel).out_dtype)


def _norm_stats(x: torch.Tensor, kernel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, rstd) of each row of x over the last dim, f32, shaped like x with the last dim 1
    (native_layer_norm's statistics) by statistics kernel `kernel`."""
    entry = kernel_entry(kernel)
    stat_shape = (*x.shape[:-1], 1)
    if entry.backend == "reference":
        var, mean = torch.var_mean(x.float(), dim=-1, correction=0, keepdim=True)
        return mean, torch.rsqrt(var + entry.eps)
    _check_dtypes(entry.label, [("x", x, torch_dtype(entry.library.info.get("dtype_in", "f32")))])
    x2, args = _norm_args(entry, x)
    mean = torch.empty(stat_shape, dtype=torch.float32, device=x.device)
    rstd = torch.empty(stat_shape, dtype=torch.float32, device=x.device)
    args.out, args.ldout, args.rstd = mean.data_ptr(), 1, rstd.data_ptr()
    _run_norm(entry, "fact::norm_stats", args, x.device)
    return mean, rstd


norm_stats = torch.library.custom_op("fact::norm_stats", _norm_stats, mutates_args=())


@norm_stats.register_fake
def _norm_stats_fake(x, kernel):
    shape = (*x.shape[:-1], 1)
    return x.new_empty(shape, dtype=torch.float32), x.new_empty(shape, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# Attention


def _attention_shapes(label: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q [B, H, S, D], k and v [B, Hkv, Sk, D] with H a multiple of Hkv (grouped-query)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise FactError(
            f"fact::attention {label}: q, k and v must be 4-D [batch, heads, seq, dim], got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    b, h, _, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[-1] != d:
        raise FactError(
            f"fact::attention {label}: k and v must both be [{b}, kv_heads, seq_k, {d}] for q "
            f"{tuple(q.shape)}, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    hkv = k.shape[1]
    if hkv == 0 or h % hkv:
        raise FactError(f"fact::attention {label}: {h} query heads are not a multiple of {hkv}")


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _reads_v_keys_contiguous(entry: AttentionKernel) -> bool:
    """The kernel reads V with its keys contiguous in place (TF32 on Hopper: its MMAs want V
    so; given V with its head dim contiguous it transposes V first)."""
    return entry.library is not None and bool(entry.library.info.get("v_keys_contiguous"))


def _attention_out(q: torch.Tensor, entry: AttentionKernel) -> torch.Tensor:
    """[B, H, S, D] in the layout the model goes on with: for bs(hd) the transpose of a
    (B, S, H, D)-contiguous buffer (the model's later transpose(1, 2).contiguous().view(b, s,
    h * d) is then free), for bhsd contiguous (B, H, S, D) (a later view(b * h, s, d) works)."""
    b, h, s, d = q.shape
    if entry.out_layout == "bhsd":
        return q.new_empty((b, h, s, d), dtype=entry.out_dtype)
    return q.new_empty((b, s, h, d), dtype=entry.out_dtype).transpose(1, 2)


def _attention_reference(entry: AttentionKernel, q, k, v) -> torch.Tensor:
    """The same function with PyTorch math, in float32 (or wider), like the kernel's
    accumulators; the query heads of a group share their K/V head."""
    compute = torch.promote_types(q.dtype, torch.float32)
    group = q.shape[1] // k.shape[1]
    qf = q.to(compute)
    kf = k.to(compute).repeat_interleave(group, dim=1)
    vf = v.to(compute).repeat_interleave(group, dim=1)
    scores = torch.matmul(qf, kf.transpose(-2, -1)) * entry.scale
    if entry.causal:  # top-left aligned: query s sees keys t <= s
        keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    return torch.matmul(torch.softmax(scores, dim=-1), vf)


def _run_attention(entry: AttentionKernel, q, k, v, out) -> None:
    lib = entry.library
    assert lib is not None
    label = entry.label or lib.name
    dtype = torch_dtype(lib.info.get("dtype", "bf16"))
    _check_dtypes(
        f"fact::attention {label}",
        [("q", q, dtype), ("k", k, dtype), ("v", v, dtype), ("out", out, dtype)],
    )
    from fact.tune.attention import args_for

    args = args_for(q, k, v, out, entry.scale, _sm_count(q.device))
    status = lib.attention_can_implement(args)
    if status != Status.OK:
        raise FactError(
            f"fact::attention {label}: the kernel cannot run q {tuple(q.shape)} stride "
            f"{q.stride()}, k {tuple(k.shape)} stride {k.stride()}, v stride {v.stride()}: "
            f"{lib.last_error()}"
        )
    lib.check(_launch(lib.attention_run, args, lib.attention_workspace_size(args), q.device))


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: int) -> torch.Tensor:
    """O = softmax(scale * Q K^T (+ causal mask)) V by attention kernel `kernel` of the table.

    q [B, H, S, D]; k, v [B, Hkv, Sk, D] (query head h reads K/V head h // (H // Hkv)); views
    with any strides, read in place where the last dim is contiguous. Returns a new O
    [B, H, S, D] in the entry's out_layout (see _attention_out).
    """
    entry = kernel_entry(kernel)
    if not isinstance(entry, AttentionKernel):
        raise FactError(f"fact::attention: kernel {kernel} is not an attention kernel")
    label = entry.label or (entry.library.name if entry.library is not None else "reference")
    _attention_shapes(label, q, k, v)
    from fact.tune.attention import v_keys_contiguous

    q, k = _last_dim_contiguous(q), _last_dim_contiguous(k)
    # V with its keys contiguous (a projection that wrote V^T) goes in place to a kernel that
    # reads it so; to any other, with its head dim made contiguous
    if not (v_keys_contiguous(v) and _reads_v_keys_contiguous(entry)):
        v = _last_dim_contiguous(v)
    out = _attention_out(q, entry)
    if entry.backend == "reference":
        out.copy_(_attention_reference(entry, q, k, v))
    else:
        with device_guard(q.device):
            _run_attention(entry, q, k, v, out)
    return out


attention = torch.library.custom_op("fact::attention", _attention, mutates_args=())


@attention.register_fake
def _attention_fake(q, k, v, kernel):
    return _attention_out(q, kernel_entry(kernel))


# ---------------------------------------------------------------------------------------------
# Pointwise regions


def dense_strides(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """True when strides lay `shape` out densely, without overlap, with the last dim
    contiguous (stride 1): some permutation of a contiguous tensor. Size-1 dims may have any
    stride."""
    if len(shape) != len(strides):
        return False
    dims = [(int(st), int(sz)) for sz, st in zip(shape, strides, strict=True) if sz != 1]
    if shape and shape[-1] != 1 and strides[-1] != 1:
        return False
    expected = 1
    for stride, size in sorted(dims):
        if stride != expected:
            return False
        expected *= size
    return True


def pointwise_out(
    shape: Sequence[int], strides: Sequence[int], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The output of fact::pointwise: laid out as traced (eager's strides) when those are dense
    with a contiguous last dim, so what reads it next sees what it saw in eager; contiguous
    otherwise. The real op and its fake both allocate through here."""
    shape, strides = [int(d) for d in shape], [int(s) for s in strides]
    if math.prod(shape) == 0 or dense_strides(shape, strides):
        return torch.empty_strided(shape, strides, dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def output_order(out: torch.Tensor) -> list[int]:
    """The dim order the kernel walks: the non-last dims by decreasing output stride (ties in
    dim order), then the last dim."""
    lead = sorted(range(out.dim() - 1), key=lambda d: (-out.stride(d), d))
    return [*lead, out.dim() - 1] if out.dim() else []


def pointwise_layout(
    out: torch.Tensor, inputs: Sequence[torch.Tensor]
) -> tuple[list[int], list[list[int]]]:
    """(shape, strides per input) of FactPointwiseArgs for writing `out` from `inputs`.

    The dims are `output_order(out)`'s, so `out` is contiguous in `shape` (FactError when it is
    not: the output must be dense with a contiguous last dim; fact::pointwise allocates it so).
    Input j is read through its own strides (elements), left-padded to the output's rank, with
    stride 0 where its size is 1 (it broadcasts); its last dim may differ from the output's
    (the kernel's slices and concatenations say where it reads), its other dims must be the
    output's or 1. A 0-dim output is walked as one element of rank 1.
    """
    if out.dim() == 0:
        out = out.reshape(1)
    rank = out.dim()
    perm = output_order(out)
    outp = out.permute(perm)
    if not outp.is_contiguous():
        raise FactError(
            f"fact::pointwise: an output of shape {list(out.shape)} and strides "
            f"{list(out.stride())} is not dense with a contiguous last dim in any dim order"
        )
    strides: list[list[int]] = []
    for j, t in enumerate(inputs):
        if t.dim() > rank:
            raise FactError(
                f"fact::pointwise: in{j} has rank {t.dim()} ({list(t.shape)}), more than the "
                f"output's {rank} ({list(out.shape)})"
            )
        pad = rank - t.dim()
        sizes = [1] * pad + list(t.shape)
        own = [0] * pad + list(t.stride())
        row = []
        for d in range(rank):
            if d < rank - 1 and sizes[d] not in (1, out.shape[d]):
                raise FactError(
                    f"fact::pointwise: in{j} of shape {list(t.shape)} does not broadcast to the "
                    f"output's {list(out.shape)} (dim {d})"
                )
            row.append(0 if sizes[d] == 1 else int(own[d]))
        strides.append([row[d] for d in perm])
    return list(outp.shape), strides


def pointwise_args(out: torch.Tensor, inputs: Sequence[torch.Tensor]) -> FactPointwiseArgs:
    """FactPointwiseArgs for writing `out` from `inputs` (see pointwise_layout)."""
    shape, strides = pointwise_layout(out, inputs)
    if len(shape) > FACT_POINTWISE_MAX_RANK or len(inputs) > FACT_POINTWISE_MAX_INPUTS:
        raise FactError(
            f"fact::pointwise: rank {len(shape)} with {len(inputs)} inputs is beyond the ABI's "
            f"{FACT_POINTWISE_MAX_RANK} dims and {FACT_POINTWISE_MAX_INPUTS} inputs"
        )
    args = FactPointwiseArgs()
    args.rank, args.n_inputs = len(shape), len(inputs)
    for d, size in enumerate(shape):
        args.shape[d] = size
    args.out = out.data_ptr()
    for j, t in enumerate(inputs):
        args.inputs[j] = t.data_ptr()
        for d, stride in enumerate(strides[j]):
            args.strides[j][d] = stride
    return args


def _pointwise_dtypes(label: str, entry: PointwiseKernel, inputs, on_cuda: bool) -> None:
    """The kernel reads raw bits: every input must have the dtype it was built for (and, for a
    generated kernel, live on CUDA). The reference twin checks the dtypes too, so that it
    refuses what its kernel would."""
    if len(inputs) != len(entry.inputs):
        raise FactError(
            f"fact::pointwise {label}: the kernel reads {len(entry.inputs)} inputs, "
            f"{len(inputs)} were given"
        )
    for j, (t, cols) in enumerate(zip(inputs, entry.input_cols or [], strict=False)):
        if t.dim() and t.shape[-1] != cols:
            raise FactError(
                f"fact::pointwise {label}: in{j} has a last dim of {t.shape[-1]}, the kernel "
                f"reads {cols} columns there (shape {list(t.shape)})"
            )
    pairs = [(f"in{j}", t, d) for j, (t, d) in enumerate(zip(inputs, entry.inputs, strict=True))]
    if on_cuda:
        _check_dtypes(f"fact::pointwise {label}", pairs)
        return
    for name, t, dtype in pairs:
        if t.dtype != dtype:
            raise FactError(
                f"fact::pointwise {label}: {name} is {t.dtype}, the kernel reads {dtype}"
            )


_MAX_LAYOUTS = 64  # packed-argument layouts kept per pointwise kernel


def _contiguous_copies(info: dict[str, Any], inputs: Sequence[torch.Tensor]) -> tuple[bool, ...]:
    """Which inputs to copy before the kernel reads them: those it was generated to read as
    contiguous, aligned vectors (the traced layout, info["access"]) that arrive otherwise (a
    caller's differently strided or offset view). Rare; correct either way."""
    access = info.get("access") or ["strided"] * len(inputs)
    vec = int(info.get("vec") or 1)

    def misfit(t: torch.Tensor) -> bool:
        if t.dim() == 0 or t.shape[-1] == 1:
            return False
        if t.stride(-1) != 1 or t.data_ptr() % (t.element_size() * vec):
            return True
        return any(st % vec for st, n in zip(t.stride()[:-1], t.shape[:-1], strict=True) if n != 1)

    return tuple(a == "contiguous" and misfit(t) for a, t in zip(access, inputs, strict=True))


def _run_pointwise(entry: PointwiseKernel, inputs: Sequence[torch.Tensor], out) -> None:
    lib = entry.library
    assert lib is not None
    label = entry.label or lib.name
    if out.numel() == 0:
        _pointwise_dtypes(label, entry, inputs, on_cuda=True)
        return
    vec = int(lib.info.get("vec") or 1)
    key = (
        out.shape,
        out.stride(),
        tuple(
            (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % (t.element_size() * vec))
            for t in inputs
        ),
    )
    cached = entry.layouts.get(key)
    if cached is None:
        _pointwise_dtypes(label, entry, inputs, on_cuda=True)  # dtypes are in the key
        if len(entry.layouts) >= _MAX_LAYOUTS:
            entry.layouts.clear()  # a caller cycling through layouts: start over
        copies = _contiguous_copies(lib.info, inputs)
        fixed = [t.contiguous() if c else t for t, c in zip(inputs, copies, strict=True)]
        cached = entry.layouts[key] = (copies, pointwise_args(out, fixed))
    copies, packed = cached
    if any(copies):
        inputs = [t.contiguous() if c else t for t, c in zip(inputs, copies, strict=True)]
    args = FactPointwiseArgs.from_buffer_copy(packed)
    args.pdl = int(_DEPENDENT.get())
    args.out = out.data_ptr()
    for j, t in enumerate(inputs):
        args.inputs[j] = t.data_ptr()
    stream = current_stream(out.device) if out.is_cuda else None
    with device_guard(out.device):
        status = lib.pointwise_run(args, stream)  # it checks can_implement first
    if status == Status.OK:
        return
    message = lib.last_error()
    if status in (Status.NOT_SUPPORTED, Status.INVALID_ARGS):
        shapes = ", ".join(
            f"in{j} {list(t.shape)} stride {list(t.stride())}" for j, t in enumerate(inputs)
        )
        raise FactError(
            f"fact::pointwise {label}: the kernel cannot run an output of {list(out.shape)} "
            f"stride {list(out.stride())} from {shapes}: {message}"
        )
    raise KernelStatusError(status, message, str(lib.path))


def _pointwise(
    inputs: list[torch.Tensor], kernel: int, shape: list[int], strides: list[int]
) -> torch.Tensor:
    """out = f(inputs) for a pointwise region by kernel `kernel` of the table.

    inputs as the graph has them (views with any strides, broadcasting to `shape` except along
    the last dim); shape and strides: the traced output's, which the new output follows when
    they are dense with a contiguous last dim (see pointwise_out). Returns a new tensor.
    """
    entry = kernel_entry(kernel)
    if not isinstance(entry, PointwiseKernel):
        raise FactError(f"fact::pointwise: kernel {kernel} is not a pointwise kernel")
    if not inputs:
        raise FactError("fact::pointwise: a pointwise region reads at least one input")
    out = pointwise_out(shape, strides, entry.out_dtype, inputs[0].device)
    if entry.backend == "reference":
        label = entry.label or "reference"
        _pointwise_dtypes(label, entry, inputs, on_cuda=False)
        wide = any(t.dtype == torch.float64 for t in inputs)
        compute = torch.float64 if wide else torch.float32
        out.copy_(eval_pointwise(entry.ssa, list(inputs), out.shape, compute).to(entry.out_dtype))
    else:
        _run_pointwise(entry, inputs, out)
    return out


pointwise = torch.library.custom_op("fact::pointwise", _pointwise, mutates_args=())


@pointwise.register_fake
def _pointwise_fake(inputs, kernel, shape, strides):
    entry = kernel_entry(kernel)
    return pointwise_out(shape, strides, entry.out_dtype, inputs[0].device)


# ---------------------------------------------------------------------------------------------
# Calling the ops without the dispatcher

# Each op's Python body. Through PyTorch's dispatcher (autograd, the custom-op wrappers, back
# into Python) a call takes several times the host time of the kernel launch itself (the host
# column of `fact bench --profile`); a composed module's eager path calls the bodies
# (impls.direct_calls).
BODIES = {
    torch.ops.fact.gemm.default: _gemm,
    torch.ops.fact.gemm_parts.default: _gemm_parts,
    torch.ops.fact.norm.default: _norm,
    torch.ops.fact.norm_stats.default: _norm_stats,
    torch.ops.fact.attention.default: _attention,
    torch.ops.fact.pointwise.default: _pointwise,
}
