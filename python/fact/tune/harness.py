"""The tuning harness: verify compiled kernels, time the survivors, and always time PyTorch too.

    python -m fact.tune.harness PLAN.json --kernels DIR_OR_MANIFEST --out results.json

In-process building blocks (they need the device; run them where a fault may kill the process):

  verify(lib, pattern, ...)       fresh random inputs on several shapes (the problem, a ragged
                                  one, a small one), NaN-poisoned output, float64 reference,
                                  ||out - ref|| / ||ref|| against the precision's tolerance
  time_kernel / time_pytorch      CUDA events, warm-up, median of >= 20 reps, L2 flushed between
                                  reps by writing a 256 MiB buffer

Fused attention patterns (family "attention") are verified and timed by fact.tune.attention
(float32 reference, scaled_dot_product_attention as the PyTorch candidate); evaluate_kernel,
evaluate_pytorch, verify, tolerance and tune dispatch there.

`tune(pattern, libraries, ...)` is the fault-isolated driver: it never touches the GPU itself but
runs the candidates in a child process (`python -m fact.tune.harness --worker JOB PROGRESS`). The
child appends JSON lines to PROGRESS as it goes ("start" before each candidate, "loaded" with the
kernel's name once its library is open, "tick" after each step: verification, each knob setting's
timing; "row" after it).
When the child dies (an illegal address kills the CUDA context, a segfault kills the process) or
makes no progress for the timeout (a kernel that hangs), the candidate it had started is recorded
as `fault` and a fresh child takes the rest, so one bad kernel never takes the run down.

Results are registry rows (engine/registry/registry.h) plus what the tuner knows besides:
{signature, arch, problem, config, time_us, error, disposition, provenance: "tuned", kernel,
library, knobs, message, verify, knob_times}. The PyTorch row has kernel "pytorch" and config
{"name": "pytorch"}; it is not a registry row (realize could not build it), so `--export` leaves
it out.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fact.errors import FactError
from fact.timing import MIN_REPS, before_timed_call  # noqa: F401 - re-exported for bench/
from fact.timing import kernel_times as time_fn
from fact.tune.abi import (
    RASTER,
    AbiError,
    KernelLibrary,
    KernelStatusError,
    Status,
    nondeterministic,
    status_name,
)

# ---------------------------------------------------------------------------------------------
# Protocol constants, in one place (shared/DESIGN.md: verification and benchmark protocols).

#: ||out - ref|| / ||ref|| thresholds against the float64 reference.
TOL_16BIT_OUTPUT = 2e-2  # bf16 / f16 outputs (and f32 GEMMs under precision "medium": bf16 math)
TOL_F32_TF32 = 2e-3  # f32 GEMMs with TF32 allowed (float32_matmul_precision "high")
TOL_F32_HIGHEST = 1e-5  # f32-accurate results ("highest"; also 16-bit inputs with f32 output)
# Fused attention, bf16 / f16 in and out, whatever the precision (f32 attention takes the f32
# thresholds of its precision, as its MMAs are TF32 or 3xTF32): rounding the output gives
# ~1e-3 (rel_err; max|out - ref| / max|ref| is 2-3e-3, as for PyTorch's own SDPA), rounding the
# probabilities to 16 bits for the second GEMM about as much again; a wrong mask, scale or head
# mapping gives 1e-1 and more.
TOL_ATTENTION = 1e-2

PRECISIONS = ("highest", "high", "medium")
DEFAULT_WARMUP = 5
# The watchdog: how long a candidate may go without progress (loading its library, verifying
# it, timing one knob setting) before it counts as a hung kernel, a fault. Each of those steps
# takes seconds; a kernel that deadlocks never finishes one.
DEFAULT_TIMEOUT_S = 120.0
STARTUP_GRACE_S = 120.0  # on top, for a worker's start (import torch, CUDA context)

DEFAULT_KNOBS = {"raster": "heuristic", "max_swizzle": 1, "splits": 1}
PYTORCH = "pytorch"
#: Plan families (of the pattern a kernel computes, runs.tuned_pattern) tuned here: the GEMM
#: families (reference.GEMM_FAMILIES) and fused attention. Row norms and pointwise regions are
#: measured in the composed module.
TUNED_FAMILIES = ("gemm", "horizontal_gemm", "attention")

#: Worker exit status after a CUDA fault: its context is unusable, the parent starts a new one.
EXIT_CUDA_FAULT = 3
EXIT_FATAL = 2


class KernelFault(FactError):
    """The device faulted while running a candidate (illegal address, launch failure): the
    process's CUDA context is unusable from here on."""


def _is_attention(pattern: Any) -> bool:
    """A plan pattern of family "attention" (or an AttentionSpec): fact.tune.attention's."""
    if isinstance(pattern, Mapping):
        return pattern.get("family") == "attention"
    from fact.tune.attention import AttentionSpec

    return isinstance(pattern, AttentionSpec)


def tolerance(pattern: Any, precision: str = "highest") -> float:
    """The rel_err threshold for a pattern's kernels under a float32 matmul precision
    (16-bit attention: TOL_ATTENTION whatever the precision)."""
    from fact.tune.reference import GemmSpec, gemm_spec

    if precision not in PRECISIONS:
        raise FactError(f"precision {precision!r} is not one of {PRECISIONS}")
    if _is_attention(pattern):
        from fact.tune.attention import _spec

        # NotSupportedError for what has no kernel (a mixed output dtype, ...). f32 attention
        # is TF32 math under "high" and "medium" alike (no bf16 variant), 3xTF32 under "highest".
        if _spec(pattern).dtype != "f32":
            return TOL_ATTENTION
        return TOL_F32_HIGHEST if precision == "highest" else TOL_F32_TF32
    spec = pattern if isinstance(pattern, GemmSpec) else gemm_spec(pattern)
    if spec.dtype_out in ("bf16", "f16"):
        return TOL_16BIT_OUTPUT
    if "f32" in (spec.dtype_a, spec.dtype_b):
        return {"highest": TOL_F32_HIGHEST, "high": TOL_F32_TF32}.get(precision, TOL_16BIT_OUTPUT)
    return TOL_F32_HIGHEST  # 16-bit inputs are exact in f32: only accumulation error remains


def rel_err(out: Any, ref: Any) -> tuple[float, str]:
    """(||out - ref|| / ||ref|| in float64 over the elements where the reference is finite, why).

    Where the float64 reference is NaN or +-Inf (log or sqrt of a negative accumulator, a
    division by zero), the output must be the same non-finite value; elsewhere it must be
    finite. So NaN/Inf in `out` where the reference is finite (a poisoned element the kernel
    never wrote, an overflow) give inf and never pass.
    """
    import torch

    out64 = out.to(torch.float64)
    ref64 = ref.to(torch.float64)
    finite = torch.isfinite(ref64)
    bad = int((~torch.isfinite(out64) & finite).sum())
    if bad:
        return math.inf, f"{bad} of {out64.numel()} output elements are NaN/Inf (unwritten?)"
    special = ~finite
    note = ""
    if bool(special.any()):
        same = (torch.isnan(out64) & torch.isnan(ref64)) | (out64 == ref64)
        differ = int((special & ~same).sum())
        if differ:
            return math.inf, (
                f"{differ} elements where the reference is NaN/Inf hold something else"
            )
        if not bool(finite.any()):
            return math.inf, "the reference has no finite value to compare with"
        note = f"{int(special.sum())} elements NaN/Inf as in the reference"
        out64, ref64 = out64[finite], ref64[finite]
    den = float(torch.linalg.vector_norm(ref64))
    num = float(torch.linalg.vector_norm(out64 - ref64))
    return (num / den if den > 0 else num), note


# ---------------------------------------------------------------------------------------------
# Device helpers. On "cpu" (the CPU tests' fake kernels) there is no stream and no sync.


def _device(device: Any):
    import torch

    return torch.device(device)


def _sync(device) -> None:
    """Wait for the device; a CUDA error surfacing here is the kernel's fault."""
    import torch

    if device.type != "cuda":
        return
    try:
        torch.cuda.synchronize(device)
    except Exception as exc:  # torch raises RuntimeError / AcceleratorError
        raise KernelFault(f"CUDA error after the kernel ran: {exc}") from exc


def _stream_ptr(device) -> int | None:
    import torch

    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None


def device_guard(device):
    """Makes `device` the current CUDA device while a kernel runs, when it is not already: the
    kernels launch on the current device (GEMMs size their grids for it, attention forks its
    streams there), while the tensors may live on another GPU."""
    import contextlib

    import torch

    if device.type != "cuda" or device.index is None:
        return contextlib.nullcontext()
    if device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def _workspace(lib: KernelLibrary, args, device):
    """(tensor keeping it alive, pointer, bytes) of the workspace the kernel asks for."""
    import torch

    nbytes = lib.workspace_size(args)
    if nbytes == 0:
        return None, None, 0
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return buf, buf.data_ptr(), nbytes


def _load(lib: KernelLibrary | str | os.PathLike[str]) -> KernelLibrary:
    return lib if isinstance(lib, KernelLibrary) else KernelLibrary(lib)


def _launch(lib: KernelLibrary, inputs, args, device) -> tuple[int, str]:
    """can_implement, workspace, run, sync. Returns (status, message); raises KernelFault when
    the device faulted or the kernel reports a CUDA error (its context may be gone)."""
    status = lib.can_implement(args)
    if status != Status.OK:
        return status, lib.last_error()
    _buf, ptr, nbytes = _workspace(lib, args, device)
    status = lib.run(args, ptr, nbytes, _stream_ptr(device))
    _sync(device)
    if status == Status.CUDA_ERROR:
        raise KernelFault(f"the kernel reported a CUDA error: {lib.last_error()}")
    return status, lib.last_error() if status != Status.OK else ""


def check_kernel_info(info: Mapping[str, Any], pattern: Any) -> list[str]:
    """Where a kernel's fact_kernel_info() disagrees with the pattern (empty when it fits).

    Checked before running, so that a manifest pointing a kernel at the wrong pattern is
    refused instead of handing it pointers it would misread. Keys the info lacks are not checked.
    """
    from fact.tune.reference import GemmSpec, gemm_spec

    spec = pattern if isinstance(pattern, GemmSpec) else gemm_spec(pattern)
    problems = []
    for key in ("family", "dtype_a", "dtype_b", "dtype_out", "layout_a", "layout_b"):
        if key in info and info[key] != getattr(spec, key):
            problems.append(f"{key}: kernel {info[key]!r}, pattern {getattr(spec, key)!r}")
    if "operands" in info:
        have = [(o.get("kind"), o.get("dtype") or spec.dtype_out) for o in info["operands"]]
        want = [(o.kind, o.dtype or spec.dtype_out) for o in spec.operands]
        if have != want:
            problems.append(f"epilogue operands: kernel {have}, pattern {want}")
    return problems


def epilogue_shape(text: str) -> str:
    """An epilogue's text with operand names replaced by '$': 'x + (acc + b)' -> '$ + (acc + $)'.
    Kernels built from patterns that differ only in node names compute the same thing."""
    return re.sub(
        r"\b(?!acc\b|inf\b|nan\b)[A-Za-z_][A-Za-z0-9_]*\b(?!\s*\()", "$", text or ""
    ).replace(" ", "")


# ---------------------------------------------------------------------------------------------
# Verification


def _shape_list(spec, problem, shapes) -> list[dict[str, Any]]:
    from fact.tune.inputs import resolve_problem, verification_shapes

    if shapes is None:
        return verification_shapes(spec, problem)
    base = resolve_problem(spec, problem)
    return [resolve_problem(spec, {**base, **dict(s)}) for s in shapes]


def _check_result(tol: float, ok: bool) -> dict[str, Any]:
    """The record verify and verify_pytorch fill in, shape by shape."""
    return {
        "ok": ok,
        "disposition": "passed",
        "rel_err": {},
        "seeds": {},
        "skipped": {},
        "tolerance": tol,
        "message": "",
    }


def record_error(
    result: dict[str, Any],
    failures: list[str],
    label: str,
    err: float,
    why: str,
    seed: int,
    tol: float,
    *,
    baseline: bool,
) -> None:
    """One checked shape into a verify record (see _check_result). A kernel fails above the
    tolerance; the PyTorch baseline (baseline=True) fails only on a non-finite error, and an
    error above the kernels' tolerance is noted (PyTorch rounding where the model does)."""
    result["rel_err"][label] = err
    result["seeds"][label] = seed
    if baseline and math.isinf(err):
        result.update(ok=False, disposition="incorrect")
        failures.append(f"{label}: {why}")
    elif baseline and not err <= tol:
        failures.append(
            f"{label}: rel_err {err:.3g} above the kernels' {tol:g}" + (f" ({why})" if why else "")
        )
    elif not err <= tol:
        failures.append(
            f"{label}: rel_err {err:.3g} > {tol:g} (seed {seed})" + (f": {why}" if why else "")
        )


def settle(result: dict[str, Any], failures: list[str]) -> dict[str, Any]:
    """A kernel's verify record once every shape is checked: incorrect with the failures,
    not supported when no shape could be checked, else passed."""
    if failures:
        result.update(disposition="incorrect", message="; ".join(failures))
    elif not result["rel_err"]:
        result.update(disposition="not_supported", message="no shape could be checked")
    result["ok"] = result["disposition"] == "passed"
    return result


def verify(
    lib: KernelLibrary | str | os.PathLike[str],
    pattern: Any,
    problem: Mapping[str, Any] | None = None,
    precision: str = "highest",
    shapes: Sequence[Mapping[str, Any]] | None = None,
    *,
    device: Any = "cuda",
    knobs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Check one kernel against the float64 reference on fresh random inputs.

    shapes: problems to check (partial dicts on top of `problem`); default: the problem, a
    ragged one and a small one (inputs.verification_shapes). The first shape must be
    implementable; later ones the kernel cannot implement are skipped, not failed.

    Returns {ok, disposition (passed | incorrect | not_supported | fault), rel_err {label: err},
    seeds {label: seed}, skipped {label: why}, tolerance, message}. Raises KernelFault when the
    device faults (the caller's process should not touch CUDA again). An attention pattern goes
    to fact.tune.attention.verify_attention (the problem, then `shapes`; no knobs).
    """
    from fact.tune.inputs import gemm_args, make_inputs, problem_label
    from fact.tune.reference import gemm_spec, reference

    if _is_attention(pattern):
        from fact.tune.attention import verify_attention

        return verify_attention(lib, pattern, problem, precision, shapes, device=device)
    spec = gemm_spec(pattern) if isinstance(pattern, dict) else pattern
    lib = _load(lib)
    dev = _device(device)
    tol = tolerance(spec, precision)
    result = _check_result(tol, ok=False)
    mismatch = check_kernel_info(lib.info, spec)
    if mismatch:
        result.update(
            disposition="not_supported",
            message="kernel does not fit the pattern: " + "; ".join(mismatch),
        )
        return result
    failures = []
    for i, prob in enumerate(_shape_list(spec, problem, shapes)):
        label = problem_label(prob)
        inputs = make_inputs(spec, prob, dev)
        args = gemm_args(inputs, knobs or DEFAULT_KNOBS)
        status, why = _launch(lib, inputs, args, dev)
        if status != Status.OK:
            text = f"{label}: {status_name(status)}: {why}"
            if i > 0 and status in (Status.NOT_SUPPORTED, Status.INVALID_ARGS):
                result["skipped"][label] = text
                continue
            disposition = "fault" if status == Status.WORKSPACE_TOO_SMALL else "not_supported"
            result.update(disposition=disposition, message=text)
            return result
        ref = reference(spec, inputs.A, inputs.B, inputs.operands)
        err, why = rel_err(inputs.D, ref)
        record_error(result, failures, label, err, why, inputs.seed, tol, baseline=False)
        del inputs, ref
    return settle(result, failures)


def verify_pytorch(
    pattern: Any,
    problem: Mapping[str, Any] | None = None,
    precision: str = "highest",
    shapes: Sequence[Mapping[str, Any]] | None = None,
    *,
    device: Any = "cuda",
) -> dict[str, Any]:
    """The PyTorch candidate through the same checks. It is the baseline, so an error above the
    kernels' tolerance (PyTorch rounding where the model does) is noted, not failed; only a
    non-finite output fails it."""
    from fact.tune.inputs import make_inputs, problem_label
    from fact.tune.reference import as_output, gemm_spec, pytorch_candidate, reference

    spec = gemm_spec(pattern) if isinstance(pattern, dict) else pattern
    dev = _device(device)
    tol = tolerance(spec, precision)
    result = _check_result(tol, ok=True)
    notes = []
    for prob in _shape_list(spec, problem, shapes):
        label = problem_label(prob)
        inputs = make_inputs(spec, prob, dev)
        out = as_output(pytorch_candidate(spec, inputs.A, inputs.B, inputs.operands))
        err, why = rel_err(out, reference(spec, inputs.A, inputs.B, inputs.operands))
        record_error(result, notes, label, err, why, inputs.seed, tol, baseline=True)
    result["message"] = "; ".join(notes)
    return result


# ---------------------------------------------------------------------------------------------
# Timing


def time_kernel(
    lib: KernelLibrary | str | os.PathLike[str],
    pattern: Any,
    problem: Mapping[str, Any] | None = None,
    knobs: Mapping[str, Any] | None = None,
    *,
    reps: int = MIN_REPS,
    warmup: int = DEFAULT_WARMUP,
    flush: bool = True,
    device: Any = "cuda",
    inputs: Any = None,
) -> float:
    """Median time (us) of one kernel launch at `problem` (or on given `inputs`, whose D holds
    the last rep's output afterwards, poisoned before the first). Raises KernelStatusError when
    the kernel refuses the knobs or problem, KernelFault when the device faults."""
    from fact.tune.inputs import make_inputs

    dev = _device(device)
    inputs = inputs if inputs is not None else make_inputs(pattern, problem, dev)
    inputs.poison()
    launch, check = kernel_launcher(lib, inputs, knobs, dev)
    times = time_fn(launch, reps=reps, warmup=warmup, flush=flush, device=dev)
    check()
    return statistics.median(times)


def kernel_launcher(
    lib: KernelLibrary | str | os.PathLike[str],
    inputs: Any,
    knobs: Mapping[str, Any] | None,
    device: Any,
) -> tuple[Callable[[], None], Callable[[], None]]:
    """(launch, check) for one GEMM kernel on `inputs` with launch `knobs`: launch() runs it
    once on the current stream (its workspace held by the closure), check() raises
    KernelFault or KernelStatusError if any launch so far did not return OK. Raises
    KernelStatusError at once when the kernel refuses the knobs or problem."""
    from fact.tune.inputs import gemm_args

    lib = _load(lib)
    dev = _device(device)
    args = gemm_args(inputs, knobs or DEFAULT_KNOBS)
    lib.check(lib.can_implement(args))
    workspace, ptr, nbytes = _workspace(lib, args, dev)
    stream = _stream_ptr(dev)
    failed: list[int] = []

    def launch() -> None:
        status = lib.run(args, ptr, nbytes, stream)
        if status != Status.OK:
            failed.append(status)

    def check() -> None:
        if failed:
            if failed[0] == Status.CUDA_ERROR:
                raise KernelFault(f"the kernel reported a CUDA error: {lib.last_error()}")
            raise KernelStatusError(failed[0], lib.last_error(), str(lib.path))

    launch.workspace = workspace  # type: ignore[attr-defined]  # alive as long as the launcher
    return launch, check


def time_pytorch(
    pattern: Any,
    problem: Mapping[str, Any] | None = None,
    *,
    reps: int = MIN_REPS,
    warmup: int = DEFAULT_WARMUP,
    flush: bool = True,
    device: Any = "cuda",
    inputs: Any = None,
) -> float:
    """Median time (us) of the unfused PyTorch path (reference.pytorch_candidate)."""
    from fact.tune.inputs import make_inputs
    from fact.tune.reference import gemm_spec, pytorch_candidate

    dev = _device(device)
    spec = gemm_spec(pattern) if isinstance(pattern, dict) else pattern
    inputs = inputs if inputs is not None else make_inputs(spec, problem, dev)

    def launch() -> None:
        pytorch_candidate(spec, inputs.A, inputs.B, inputs.operands)

    return statistics.median(time_fn(launch, reps=reps, warmup=warmup, flush=flush, device=dev))


def knob_combinations(
    pattern: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    mode: str = "sweep",
    deterministic: bool = False,
) -> list[dict[str, Any]]:
    """Launch knobs to time a kernel with (LaunchKnobs JSON). "default": the heuristic only.
    "sweep": that, plus raster x swizzle from the pattern's search_space (along_m/along_n x
    1/2/4/8 when it has none), plus, for stream-K kernels, split-K 2 and 4, the stream-K
    decomposition (whenever the last wave is partial, where CUTLASS's heuristic wants it less
    than half full) and the data-parallel one (where the heuristic would share tiles out), and
    (unless `deterministic`, PyTorch's torch.use_deterministic_algorithms)
    the nondeterministic reduction with each raster order and no swizzle, and with the stream-K
    decomposition. An sm80 multistage kernel takes the default
    alone: its threadblock swizzle is fixed and it has no split-K. A grouped (horizontal) kernel
    has no raster heuristic: its default launch is along M."""
    if mode not in ("default", "sweep"):
        raise FactError(f"knob mode {mode!r} is not 'default' or 'sweep'")
    if mode == "default" or (config or {}).get("kernel_schedule") == "multistage":
        return [dict(DEFAULT_KNOBS)]
    space = (pattern or {}).get("search_space") or {}
    rasters = [r for r in space.get("raster", ["along_m", "along_n"]) if r in RASTER]
    swizzles = [int(s) for s in space.get("swizzle", [1, 2, 4, 8])]
    combos = [dict(DEFAULT_KNOBS)]
    if config and config.get("tile_scheduler") == "group":
        # CUTLASS's group scheduler has no raster heuristic (the kernel runs along M for it):
        # the default is that launch, named as what it is
        combos = [{**DEFAULT_KNOBS, "raster": "along_m"}]
    combos += [{"raster": r, "max_swizzle": s, "splits": 1} for r in rasters for s in swizzles]
    if config and config.get("tile_scheduler") == "stream_k":
        combos += [{"raster": "heuristic", "max_swizzle": 1, "splits": s} for s in (2, 4)]
        sk = {"raster": "heuristic", "max_swizzle": 1, "splits": 1, "decomposition": "stream_k"}
        combos += [sk, {**sk, "decomposition": "data_parallel"}]
        if not deterministic:
            nd = {"max_swizzle": 1, "splits": 1, "reduction": "nondeterministic"}
            combos += [{"raster": r, **nd} for r in ["heuristic", *rasters]]
            combos.append({**sk, "reduction": "nondeterministic"})
    unique: list[dict[str, Any]] = []
    for c in combos:
        if c not in unique:
            unique.append(c)
    return unique


def knob_name(knobs: Mapping[str, Any]) -> str:
    """LaunchKnobs::name(): 'r_heur_s1_k1'; '_nd' for a nondeterministic reduction, '_sk' /
    '_dp' for a stream-K / data-parallel decomposition."""
    raster = knobs.get("raster", "heuristic")
    short = {"heuristic": "heur", "along_m": "m", "along_n": "n", 0: "heur", 1: "m", 2: "n"}
    nd = "_nd" if nondeterministic(knobs) else ""
    decomposition = knobs.get("decomposition", "heuristic")
    dec = {"stream_k": "_sk", 1: "_sk", "data_parallel": "_dp", 2: "_dp"}.get(decomposition, "")
    swizzle, splits = knobs.get("max_swizzle", 1), knobs.get("splits", 1)
    return f"r_{short.get(raster, raster)}_s{swizzle}_k{splits}{nd}{dec}"


# ---------------------------------------------------------------------------------------------
# One candidate, in process (the worker's job)


def make_row(
    pattern: Mapping[str, Any],
    arch: str,
    problem: Mapping[str, Any],
    *,
    kernel: str,
    library: str | None,
    config: Mapping[str, Any] | None,
    disposition: str,
    time_us: float | None = None,
    error: float | None = None,
    knobs: Mapping[str, Any] | None = None,
    message: str = "",
    **extra: Any,
) -> dict[str, Any]:
    """A result row: the registry's fields first, then the tuner's."""
    return {
        "signature": pattern.get("signature", ""),
        "arch": arch,
        "problem": dict(problem),
        "config": dict(config or {}),
        "time_us": time_us,
        "error": error,
        "disposition": disposition,
        "provenance": "tuned",
        "kernel": kernel,
        "library": library,
        "knobs": dict(knobs) if knobs is not None else None,
        "message": message,
        **extra,
    }


def open_candidate(
    candidate: Mapping[str, Any],
    row: Mapping[str, Any],
    on_load: Callable[[str, Mapping[str, Any]], None] | None = None,
) -> tuple[KernelLibrary | None, dict[str, Any]]:
    """Load a candidate's library ({kernel, library, config}). Returns the library and the
    row's fields (row plus library, kernel and config, the library's own where the candidate
    names none), or None and its finished not_supported row when the library does not load.
    on_load(kernel, config) is called once it has loaded, before anything runs."""
    library = str(candidate.get("library") or "")
    config = candidate.get("config")
    fields = {**row, "library": library}
    try:
        lib = _load(library)
    except AbiError as exc:
        return None, make_row(
            **fields,
            kernel=candidate.get("kernel") or Path(library).name,
            config=config,
            disposition="not_supported",
            message=str(exc),
        )
    fields["kernel"] = candidate.get("kernel") or lib.name
    fields["config"] = config if config is not None else lib.info.get("config", {})
    if on_load is not None:
        on_load(fields["kernel"], fields["config"])
    return lib, fields


def _max_err(errs: Iterable[float]) -> float | None:
    values = list(errs)
    return max(values) if values else None


def evaluate_kernel(
    candidate: Mapping[str, Any],
    pattern: Mapping[str, Any],
    *,
    arch: str = "sm90",
    precision: str = "highest",
    problem: Mapping[str, Any] | None = None,
    shapes: Sequence[Mapping[str, Any]] | None = None,
    knobs_list: Sequence[Mapping[str, Any]] | None = None,
    deterministic: bool = False,
    reps: int = MIN_REPS,
    warmup: int = DEFAULT_WARMUP,
    flush: bool = True,
    device: Any = "cuda",
    on_load: Callable[[str, Mapping[str, Any]], None] | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Verify then time one kernel ({kernel, library, config}); returns its row.

    Every knob combination's output is compared with the reference too (split-K changes the
    summation order); a combination that fails is not timed as a win. on_load(kernel, config)
    is called once the library is loaded, before anything runs; on_progress(step) after the
    verification ("verified") and after each knob combination (its knob_name). Raises
    KernelFault. Attention patterns go to fact.tune.attention.evaluate_attention_kernel.
    """
    from fact.tune.inputs import make_inputs, resolve_problem
    from fact.tune.reference import gemm_spec, reference

    if _is_attention(pattern):
        from fact.tune.attention import evaluate_attention_kernel

        return evaluate_attention_kernel(
            candidate,
            pattern,
            arch=arch,
            precision=precision,
            problem=problem,
            shapes=shapes,
            knobs_list=knobs_list,
            reps=reps,
            warmup=warmup,
            flush=flush,
            device=device,
            on_load=on_load,
            on_progress=on_progress,
        )
    spec = gemm_spec(dict(pattern))
    prob = resolve_problem(spec, problem)
    lib, row = open_candidate(candidate, dict(pattern=pattern, arch=arch, problem=prob), on_load)
    if lib is None:
        return row
    dev = _device(device)
    v = verify(lib, spec, prob, precision, shapes, device=dev)
    if on_progress:
        on_progress("verified")
    if not v["ok"]:
        return make_row(
            **row,
            disposition=v["disposition"],
            error=_max_err(e for e in v["rel_err"].values() if not math.isnan(e)),
            message=v["message"],
            verify=v,
        )
    combos = (
        list(knobs_list)
        if knobs_list
        else knob_combinations(pattern, row["config"], deterministic=deterministic)
    )
    inputs = make_inputs(spec, prob, dev)
    ref = reference(spec, inputs.A, inputs.B, inputs.operands)
    knob_times = []
    for knobs in combos:
        entry: dict[str, Any] = {"knobs": dict(knobs), "name": knob_name(knobs)}
        try:
            entry["time_us"] = time_kernel(
                lib,
                spec,
                knobs=knobs,
                reps=reps,
                warmup=warmup,
                flush=flush,
                device=dev,
                inputs=inputs,
            )
        except KernelStatusError as exc:  # e.g. split-K on a persistent kernel: not this combo
            entry.update(time_us=None, status=exc.kernel_message or str(exc))
            knob_times.append(entry)
            continue
        finally:
            if on_progress:
                on_progress(entry["name"])
        err, why = rel_err(inputs.D, ref)
        entry["rel_err"] = err
        if not err <= v["tolerance"]:
            entry["status"] = f"incorrect: rel_err {err:.3g}" + (f" ({why})" if why else "")
        knob_times.append(entry)
    good = [e for e in knob_times if e.get("time_us") is not None and "status" not in e]
    errors = list(v["rel_err"].values()) + [e["rel_err"] for e in knob_times if "rel_err" in e]
    if not good:
        timed = [e for e in knob_times if e.get("time_us") is not None]
        disposition = "incorrect" if timed else "not_supported"
        why = "; ".join(f"{e['name']}: {e.get('status')}" for e in knob_times)
        return make_row(
            **row,
            disposition=disposition,
            error=_max_err(errors),
            message=f"no knob combination passed: {why}",
            verify=v,
            knob_times=knob_times,
        )
    best = min(good, key=lambda e: e["time_us"])
    bad = [f"{e['name']}: {e['status']}" for e in knob_times if "status" in e]
    return make_row(
        **row,
        disposition="passed",
        time_us=best["time_us"],
        error=_max_err(errors),
        knobs=best["knobs"],
        message="; ".join(bad),
        verify=v,
        knob_times=knob_times,
    )


def evaluate_pytorch(
    pattern: Mapping[str, Any],
    *,
    arch: str = "sm90",
    precision: str = "highest",
    problem: Mapping[str, Any] | None = None,
    shapes: Sequence[Mapping[str, Any]] | None = None,
    reps: int = MIN_REPS,
    warmup: int = DEFAULT_WARMUP,
    flush: bool = True,
    device: Any = "cuda",
    on_progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The PyTorch candidate's row: verified like a kernel (see verify_pytorch), then timed;
    on_progress("verified") between the two. Attention patterns:
    fact.tune.attention.evaluate_attention_pytorch (SDPA)."""
    from fact.tune.inputs import resolve_problem
    from fact.tune.reference import gemm_spec

    if _is_attention(pattern):
        from fact.tune.attention import evaluate_attention_pytorch

        return evaluate_attention_pytorch(
            pattern,
            arch=arch,
            precision=precision,
            problem=problem,
            shapes=shapes,
            reps=reps,
            warmup=warmup,
            flush=flush,
            device=device,
            on_progress=on_progress,
        )
    spec = gemm_spec(dict(pattern))
    prob = resolve_problem(spec, problem)
    v = verify_pytorch(spec, prob, precision, shapes, device=device)
    if on_progress:
        on_progress("verified")
    row = dict(
        pattern=pattern,
        arch=arch,
        problem=prob,
        kernel=PYTORCH,
        library=None,
        config={"name": PYTORCH},
        verify=v,
    )
    finite = [e for e in v["rel_err"].values() if math.isfinite(e)]
    if not v["ok"]:
        return make_row(
            **row, disposition=v["disposition"], error=_max_err(finite), message=v["message"]
        )
    t = time_pytorch(spec, prob, reps=reps, warmup=warmup, flush=flush, device=device)
    return make_row(
        **row, disposition="passed", time_us=t, error=_max_err(finite), message=v["message"]
    )


# ---------------------------------------------------------------------------------------------
# The worker: runs candidates in this process, reporting to a progress file.


def _looks_like_cuda_fault(exc: BaseException) -> bool:
    import torch

    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("CUDA error" in text or "illegal" in text)


def environment(device: Any) -> dict[str, Any]:
    """What the numbers were measured on: GPU, clocks when known, CUDA, PyTorch, host."""
    import torch

    dev = _device(device)
    env: dict[str, Any] = {
        "device": str(dev),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "host": platform.node(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        env.update(
            gpu=props.name,
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
        )
        try:
            # read before any work, so usually the idle clock; needs pynvml (optional)
            env["sm_clock_mhz_at_start"] = torch.cuda.clock_rate(dev)
        except Exception:
            pass
    return env


def _worker(job_path: str, progress_path: str) -> int:
    """`python -m fact.tune.harness --worker JOB PROGRESS`: evaluate the job's candidates in
    order, appending {"event": "start" | "loaded" | "tick" | "row" | "env" | "fatal", ...} lines
    to PROGRESS ("tick": the candidate finished a step, see evaluate_kernel's on_progress)."""
    import torch

    job = json.loads(Path(job_path).read_text())
    progress = open(progress_path, "a", encoding="utf-8")  # open until the process ends

    def emit(event: dict[str, Any]) -> None:
        # one line per event, flushed at once: if this process dies next, the parent still
        # knows what it had started and what it had finished
        progress.write(json.dumps(event) + "\n")
        progress.flush()

    dev = _device(job["device"])
    if dev.type == "cuda" and not torch.cuda.is_available():
        emit({"event": "fatal", "message": "CUDA is not available in the tuning worker"})
        return EXIT_FATAL
    # PyTorch's own switch, so that the pytorch candidate follows the same precision policy
    torch.set_float32_matmul_precision(job["precision"])
    emit({"event": "env", "environment": environment(dev)})
    common = dict(
        arch=job["arch"],
        precision=job["precision"],
        problem=job.get("problem"),
        shapes=job.get("shapes"),
        reps=job["reps"],
        warmup=job["warmup"],
        flush=job["flush"],
        device=dev,
    )
    pattern = job["pattern"]
    for cand in job["candidates"]:
        emit({"event": "start", "id": cand["id"]})
        exit_after = False

        def tick(step: str, i: int = cand["id"]) -> None:
            emit({"event": "tick", "id": i, "step": step})

        try:
            if cand.get("kernel") == PYTORCH and not cand.get("library"):
                row = evaluate_pytorch(pattern, on_progress=tick, **common)
            else:
                row = evaluate_kernel(
                    cand,
                    pattern,
                    knobs_list=job.get("knobs_list"),
                    deterministic=bool(job.get("deterministic")),
                    on_load=lambda kernel, config, i=cand["id"]: emit(
                        {"event": "loaded", "id": i, "kernel": kernel, "config": config}
                    ),
                    on_progress=tick,
                    **common,
                )
        except Exception as exc:
            fault = isinstance(exc, KernelFault) or _looks_like_cuda_fault(exc)
            exit_after = fault and dev.type == "cuda"
            what = "device fault" if fault else "harness error"
            tail = traceback.format_exc(limit=3).strip().splitlines()[-1]
            row = _fault_row(job, cand, f"{what}: {exc}" if fault else f"{what}: {tail}")
        emit({"event": "row", "id": cand["id"], "row": row})
        if exit_after:
            # The context is broken; the parent starts a fresh worker for the rest. Exit at
            # once: tearing down torch's CUDA state in a dead context can hang or abort.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_CUDA_FAULT)
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return 0


def resolve_pattern_problem(
    pattern: Mapping[str, Any], problem: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The pattern's problem with `problem`'s sizes on top, per family (GEMM: {batch, m, n, k};
    attention: {batch, heads, kv_heads, seq_q, seq_k, head_dim, head_dim_v}). Raises
    NotSupportedError / FactError for a pattern the tuner cannot handle."""
    if _is_attention(pattern):
        from fact.tune.attention import AttentionSpec

        return dict(AttentionSpec.from_pattern(pattern, problem).problem)
    from fact.tune.inputs import resolve_problem
    from fact.tune.reference import gemm_spec

    return resolve_problem(gemm_spec(dict(pattern)), problem)


def _fault_row(job: Mapping[str, Any], cand: Mapping[str, Any], message: str) -> dict[str, Any]:
    problem = resolve_pattern_problem(job["pattern"], job.get("problem"))
    return make_row(
        job["pattern"],
        job["arch"],
        problem,
        kernel=cand.get("kernel") or Path(cand.get("library") or "?").name,
        library=cand.get("library"),
        config=cand.get("config"),
        disposition="fault",
        message=message,
    )


# ---------------------------------------------------------------------------------------------
# The fault-isolated driver


def _candidate(lib: Any) -> dict[str, Any]:
    """A library path or manifest entry as {kernel, library, config}."""
    if isinstance(lib, Mapping):
        if not lib.get("library"):
            raise FactError(f"kernel entry {dict(lib)} has no 'library'")
        return {
            "kernel": lib.get("kernel"),
            "library": str(lib["library"]),
            "config": lib.get("config"),
        }
    if isinstance(lib, KernelLibrary):
        return {"kernel": lib.name, "library": str(lib.path), "config": lib.info.get("config")}
    return {"kernel": None, "library": str(lib), "config": None}


def _read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a dying worker
            break
    return events


def _describe_exit(returncode: int | None, timed_out: bool, timeout_s: float) -> str:
    if timed_out:
        return f"timed out: no progress for {timeout_s:g} s"
    if returncode is not None and returncode < 0:
        try:
            return f"the worker died of {signal.Signals(-returncode).name}"
        except ValueError:
            return f"the worker died of signal {-returncode}"
    return f"the worker exited with status {returncode}"


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding fact/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _deterministic() -> bool:
    """Whether this process asked PyTorch for deterministic algorithms (False without torch)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.are_deterministic_algorithms_enabled())


def tune(
    pattern: Mapping[str, Any],
    libraries: Sequence[Any],
    precision: str = "highest",
    knobs_list: Sequence[Mapping[str, Any]] | None = None,
    *,
    arch: str = "sm90",
    problem: Mapping[str, Any] | None = None,
    shapes: Sequence[Mapping[str, Any]] | None = None,
    reps: int = MIN_REPS,
    warmup: int = DEFAULT_WARMUP,
    flush: bool = True,
    device: str = "cuda",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    python: str | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    details: dict[str, Any] | None = None,
    deterministic: bool | None = None,
) -> list[dict[str, Any]]:
    """Verify and time every library for one pattern, plus the PyTorch candidate, each in a
    child process; returns one row per candidate, PyTorch first, then libraries in order.

    libraries: .so paths, KernelLibrary objects or manifest entries {kernel, library, config}.
    knobs_list: launch knobs to time each kernel with (default: knob_combinations per kernel;
    without nondeterministic reductions when `deterministic`, which defaults to this process's
    torch.are_deterministic_algorithms_enabled(): the workers are other processes).
    A kernel is timed only if it passes verification; its row has the best knobs' median time.
    Dispositions: passed | incorrect | not_supported | fault. progress(row) is called as each
    row arrives; details (a dict) receives the worker's environment and how many workers ran.
    Attention patterns (fact.tune.attention) go the same way: their kernels have no launch knobs
    (knobs_list is ignored), the PyTorch candidate is scaled_dot_product_attention.
    """
    if precision not in PRECISIONS:
        raise FactError(f"precision {precision!r} is not one of {PRECISIONS}")
    prob = resolve_pattern_problem(pattern, problem)  # fails early on a bad pattern
    candidates = [{"kernel": PYTORCH, "library": None, "config": {"name": PYTORCH}}]
    candidates += [_candidate(lib) for lib in libraries]
    for i, cand in enumerate(candidates):
        cand["id"] = i
    job = {
        "pattern": dict(pattern),
        "arch": arch,
        "precision": precision,
        "problem": prob,
        "shapes": [dict(s) for s in shapes] if shapes else None,
        "knobs_list": [dict(k) for k in knobs_list] if knobs_list else None,
        "deterministic": _deterministic() if deterministic is None else bool(deterministic),
        "reps": reps,
        "warmup": warmup,
        "flush": flush,
        "device": device,
    }
    rows: dict[int, dict[str, Any]] = {}
    pending = candidates
    workers = 0
    with tempfile.TemporaryDirectory(prefix="fact-tune-") as tmp:
        while pending:
            workers += 1
            folder = Path(tmp) / f"worker{workers}"
            folder.mkdir()
            events, returncode, timed_out = _run_worker(
                {**job, "candidates": pending}, folder, timeout_s, python, rows, progress
            )
            for event in events:
                if event.get("event") == "env" and details is not None:
                    details["environment"] = event["environment"]
                if event.get("event") == "fatal":
                    raise FactError(f"tuning worker: {event['message']}")
            started = [e["id"] for e in events if e.get("event") == "start"]
            unfinished = [i for i in started if i not in rows]
            if unfinished:  # it died (or hung) inside this candidate: that one faulted
                cand = dict(candidates[unfinished[-1]])
                for event in events:  # the name and config the library reported, if it loaded
                    if event.get("event") == "loaded" and event["id"] == cand["id"]:
                        cand.update(kernel=event["kernel"], config=event["config"])
                why = _describe_exit(returncode, timed_out, timeout_s)
                log = _tail(folder / "log.txt")
                rows[cand["id"]] = _fault_row(job, cand, why + (f"; log: {log}" if log else ""))
                if progress:
                    progress(rows[cand["id"]])
            elif not started and returncode != 0:
                raise FactError(
                    "the tuning worker failed before running any candidate "
                    f"({_describe_exit(returncode, timed_out, timeout_s)}): "
                    f"{_tail(folder / 'log.txt', 20)}"
                )
            remaining = [c for c in pending if c["id"] not in rows]
            if len(remaining) == len(pending):
                raise FactError("the tuning worker made no progress; see its log")
            pending = remaining
    if details is not None:
        details["workers"] = workers
    return [rows[c["id"]] for c in candidates]


def _run_worker(job, folder: Path, timeout_s, python, rows, progress):
    """Start one worker on the job and watch it; returns (events, returncode, timed_out).
    Rows it finishes go into `rows` (and to `progress`) as they appear."""
    job_path, progress_path, log_path = (
        folder / "job.json",
        folder / "progress.jsonl",
        folder / "log.txt",
    )
    job_path.write_text(json.dumps(job))
    progress_path.touch()
    cmd = [
        python or sys.executable,
        "-m",
        "fact.tune.harness",
        "--worker",
        str(job_path),
        str(progress_path),
    ]
    timed_out = False
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_worker_env())
        seen = 0
        started_any = False
        clock = time.monotonic()  # the current candidate's last progress (or the worker's start)
        try:
            while True:
                returncode = proc.poll()
                events = _read_events(progress_path)
                for event in events[seen:]:
                    if event.get("event") in ("start", "loaded", "tick"):
                        clock = time.monotonic()
                        started_any = True
                    if event.get("event") == "row":
                        rows[event["id"]] = event["row"]
                        if progress:
                            progress(event["row"])
                seen = len(events)
                if returncode is not None:
                    break
                # importing torch and creating a CUDA context is not the candidate's time
                allowed = timeout_s if started_any else timeout_s + STARTUP_GRACE_S
                if time.monotonic() - clock > allowed:
                    proc.kill()  # a hung kernel: the whole worker goes, the parent goes on
                    proc.wait()
                    timed_out = True
                    returncode = proc.returncode
                    break
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    events = _read_events(progress_path)
    for event in events:
        if event.get("event") == "row" and event["id"] not in rows:
            rows[event["id"]] = event["row"]
            if progress:
                progress(event["row"])
    return events, returncode, timed_out


# ---------------------------------------------------------------------------------------------
# Manifests, kernel folders, results


def load_manifest(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], str | None]:
    """A kernel manifest: a JSON list of {pattern_index, kernel, library, config}, or an object
    {"plan": PLAN.json, "kernels": [...]}, or a folder holding manifest.json (the run directory
    `fact-engine realize --out RUN` writes, with RUN/plan.json beside it).

    Returns (entries, plan path or None); relative library and plan paths are resolved against
    the manifest's folder. Entries without a library are kept when they carry realize's
    "status" (compile_error, not_supported): they become rows without being run.
    """
    path = Path(path).resolve()
    if path.is_dir():
        path = path / "manifest.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise FactError(f"{path}: cannot read the kernel manifest: {exc}") from exc
    plan = None
    if isinstance(doc, dict):
        plan = doc.get("plan")
        doc = doc.get("kernels")
    elif (path.parent / "plan.json").is_file():
        plan = "plan.json"
    if not isinstance(doc, list):
        raise FactError(
            f"{path}: a manifest is a list of {{pattern_index, kernel, library, config}} "
            '(or {"plan", "kernels"})'
        )
    entries = []
    for i, entry in enumerate(doc):
        if not isinstance(entry, dict):
            raise FactError(f"{path}: entry {i} is not an object")
        if not isinstance(entry.get("pattern_index"), int) and "pattern" not in entry:
            raise FactError(f"{path}: entry {i} needs an integer 'pattern_index'")
        if not entry.get("library"):
            if entry.get("status") in ("compile_error", "not_supported"):
                entries.append({**entry, "library": None})
                continue
            raise FactError(f"{path}: entry {i} needs a 'library' (or realize's 'status')")
        library = Path(entry["library"])
        if not library.is_absolute():
            library = path.parent / library
        entries.append({**entry, "library": str(library)})
    if plan is not None and not Path(plan).is_absolute():
        plan = str(path.parent / plan)
    return entries, plan


def scan_kernels(folder: str | os.PathLike[str], plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Manifest entries for every kernel .so under `folder` (e.g. the kernel cache), matched to
    the plan's GEMM patterns by fact_kernel_info(): family, dtypes, layouts, operand kinds and
    the epilogue up to operand names; and to its attention patterns by family, dtype, causal
    and head dim. A kernel may serve several patterns."""
    from fact.tune.reference import NotSupportedError, gemm_spec

    specs = {}
    attention_specs = {}
    for i, pattern in enumerate(plan.get("patterns", [])):
        try:
            if _is_attention(pattern):
                from fact.tune.attention import AttentionSpec

                attention_specs[i] = AttentionSpec.from_pattern(pattern)
            else:
                specs[i] = gemm_spec(pattern)
        except (NotSupportedError, FactError):
            continue
    entries = []
    for so in sorted(Path(folder).rglob("*.so")):
        try:
            lib = KernelLibrary(so)
            info = lib.info
        except AbiError as exc:
            print(f"fact-tune: skipping {so}: {exc}", file=sys.stderr)
            continue
        if lib.family == "attention":
            from fact.tune.attention import check_kernel_info as check_attention_info

            for i, att in attention_specs.items():
                if not check_attention_info(info, att):
                    entries.append(
                        {
                            "pattern_index": i,
                            "kernel": lib.name,
                            "library": str(so),
                            "config": info.get("config"),
                        }
                    )
            continue
        for i, spec in specs.items():
            if check_kernel_info(info, spec):
                continue
            if "epilogue" in info and epilogue_shape(info["epilogue"]) != epilogue_shape(spec.text):
                continue
            entries.append(
                {
                    "pattern_index": i,
                    "kernel": lib.name,
                    "library": str(so),
                    "config": info.get("config"),
                }
            )
    return entries


def registry_export(rows: Iterable[Mapping[str, Any]], command: str = "") -> dict[str, Any]:
    """A registry export document (`fact-engine registry import`) of the kernel rows; the
    PyTorch rows are left out (their config is no kernel realize could build)."""
    keys = (
        "signature",
        "arch",
        "problem",
        "config",
        "time_us",
        "error",
        "disposition",
        "provenance",
        "knobs",
    )
    return {
        "fact_registry_export": 1,
        "schema_version": 2,
        "produced_by": {
            "host": platform.node(),
            "command": command,
            "registry": "",
            "date": _now(),
        },
        "rows": [{k: r.get(k) for k in keys} for r in rows if r.get("kernel") != PYTORCH],
    }


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def json_safe(obj: Any) -> Any:
    """Strict JSON: non-finite floats (an unwritten output's inf error) become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


def attach_advisories(rows: Sequence[dict[str, Any]], entries: Sequence[Mapping[str, Any]]) -> None:
    """Copy realize's ptxas advisories (manifest "advisories": serialized WGMMAs and the like)
    onto the rows of their kernels, into "advisories" and the row's message."""
    by_kernel = {e.get("kernel"): e["advisories"] for e in entries if e.get("advisories")}
    for row in rows:
        if row.get("kernel") not in by_kernel:
            continue
        row["advisories"] = list(by_kernel[row["kernel"]])
        note = "ptxas " + "; ".join(row["advisories"])
        row["message"] = f"{row['message']}; {note}" if row.get("message") else note


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """pattern | kernel | disposition | rel_err | time | vs pytorch (its time / this time), then
    a line per ptxas advisory of a kernel."""
    baseline = {
        r.get("pattern_index"): r.get("time_us")
        for r in rows
        if r.get("kernel") == PYTORCH and r.get("time_us")
    }
    header = ("pattern", "kernel", "disposition", "rel_err", "time_us", "vs pytorch")
    lines = []
    for r in rows:
        t, err = r.get("time_us"), r.get("error")
        base = baseline.get(r.get("pattern_index"))
        ratio = f"{base / t:.2f}x" if t and base else "-"
        index = r.get("pattern_index")
        sig = r.get("signature", "")
        pattern = f"{index}: {sig}" if index is not None else sig
        lines.append(
            (
                _short(pattern, 60),
                _short(str(r.get("kernel")), 56),
                r.get("disposition", ""),
                f"{err:.2e}" if isinstance(err, (int, float)) and math.isfinite(err) else "-",
                f"{t:.1f}" if t else "-",
                ratio,
            )
        )
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines, strict=True)]
    out = [
        "  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)).rstrip()
        for line in [header, tuple("-" * w for w in widths), *lines]
    ]
    # Kernels ptxas warned about (serialized WGMMAs and the like): why one may run slow.
    out += [
        f"{r.get('kernel')}: ptxas {a}"
        for r in rows
        if r.get("advisories")
        for a in r["advisories"]
    ]
    return "\n".join(out)


def _parse_knobs(text: str | None) -> tuple[str, list[dict[str, Any]] | None]:
    """--knobs: 'default' | 'sweep' | a JSON list (or a file holding one)."""
    if text in (None, "sweep", "default"):
        return text or "sweep", None
    # Inline JSON first: a long list is not a file name (stat would fail with ENAMETOOLONG).
    if text.lstrip().startswith("["):
        raw = text
    elif Path(text).is_file():
        raw = Path(text).read_text()
    else:
        raise FactError(f"--knobs: {text!r} is not 'default', 'sweep', a JSON list or a file")
    try:
        knobs = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise FactError(f"--knobs: not 'default', 'sweep' or a JSON list: {exc}") from exc
    if not isinstance(knobs, list) or not all(isinstance(k, dict) for k in knobs):
        raise FactError(
            "--knobs: the JSON must be a list of "
            "{raster, max_swizzle, splits, reduction, decomposition}"
        )
    return "list", knobs


def _unbuilt_row(pattern, arch, problem, entry) -> dict[str, Any]:
    """A row for a manifest entry realize could not build (compile_error / not_supported)."""
    status = entry.get("status")
    return make_row(
        pattern,
        arch,
        resolve_pattern_problem(pattern, problem),
        kernel=entry.get("kernel") or "-",
        library=None,
        config=entry.get("config"),
        disposition="compile_error" if status == "compile_error" else "not_supported",
        message=str(entry.get("detail") or status),
    )


def _json_arg(flag: str, text: str | None, kind: type) -> Any:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FactError(f"{flag}: not JSON: {exc}") from exc
    if not isinstance(value, kind):
        raise FactError(f"{flag}: expected a JSON {kind.__name__}, got {type(value).__name__}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fact.tune.harness",
        description="Verify and time compiled FACT kernels for a plan's patterns, against "
        "the unfused PyTorch path (fault-isolated: a crashing kernel is marked 'fault').",
    )
    p.add_argument("plan", help="the plan JSON (fact discover --json)")
    p.add_argument(
        "--kernels",
        required=True,
        help="a manifest JSON ([{pattern_index, kernel, library, config}]), a realize run "
        "directory (holding manifest.json), or a folder of kernel .so files (matched to the "
        "plan's patterns by fact_kernel_info)",
    )
    p.add_argument("--out", required=True, help="where to write the results JSON")
    p.add_argument("--export", help="also write a registry export of the kernel rows here")
    p.add_argument(
        "--precision", choices=PRECISIONS, help="float32 matmul precision (default: the plan's)"
    )
    p.add_argument("--knobs", help="'sweep' (default), 'default' or a JSON list of knobs")
    p.add_argument("--patterns", help="comma-separated pattern indices (default: all)")
    p.add_argument(
        "--problem",
        help="JSON sizes on top of each pattern's problem, e.g. '{\"m\": 4096}' (rows then "
        "record the overridden problem)",
    )
    p.add_argument(
        "--shapes",
        help="JSON list of verification shapes (partial sizes on top of the problem); default: "
        "the problem, a ragged m=1000 n=776 k=200 and a small ragged one",
    )
    p.add_argument("--reps", type=int, default=MIN_REPS)
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    p.add_argument("--no-flush", action="store_true", help="do not flush L2 between reps")
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds a candidate may go without progress (loading, verifying, timing one "
        "knob setting) before it counts as a hung kernel, a fault",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        if len(argv) != 3:
            print("usage: python -m fact.tune.harness --worker JOB PROGRESS", file=sys.stderr)
            return EXIT_FATAL
        return _worker(argv[1], argv[2])
    args = _parser().parse_args(argv)
    try:
        return _cli(args, argv)
    except FactError as exc:
        print(f"fact-tune: error: {exc}", file=sys.stderr)
        return 2


def _cli(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from fact.tune.runs import tuned_pattern

    plan_path = Path(args.plan)
    try:
        plan = json.loads(plan_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise FactError(f"{plan_path}: cannot read the plan: {exc}") from exc
    patterns = plan.get("patterns") or []
    kernels = Path(args.kernels)
    if kernels.is_dir() and not (kernels / "manifest.json").is_file():
        entries = scan_kernels(kernels, plan)
    else:
        entries, _ = load_manifest(kernels)
    wanted = None
    if args.patterns:
        wanted = {int(x) for x in args.patterns.split(",") if x.strip()}
    precision = args.precision or plan.get("float32_matmul_precision") or "highest"
    mode, knobs_list = _parse_knobs(args.knobs)
    problem = _json_arg("--problem", args.problem, dict)
    shapes = _json_arg("--shapes", args.shapes, list)
    arch = plan.get("arch", "sm90")
    by_pattern: dict[int, list[dict[str, Any]]] = {}
    for entry in entries:
        index = entry.get("pattern_index")
        if not isinstance(index, int) or not 0 <= index < len(patterns):
            raise FactError(
                f"manifest entry {entry.get('kernel')}: pattern_index {index} is "
                f"not one of the plan's {len(patterns)} patterns"
            )
        if (entry.get("config") or {}).get("form") == "tail":
            continue  # a gated MLP's pointwise tail: checked in the composed module's context
        if wanted is None or index in wanted:
            by_pattern.setdefault(index, []).append(entry)
    if not by_pattern:
        raise FactError(f"no kernels for the selected patterns in {args.kernels}")
    all_rows: list[dict[str, Any]] = []
    details: dict[str, Any] = {}

    def report(row: dict[str, Any]) -> None:
        t = f"{row['time_us']:.1f} us" if row.get("time_us") else ""
        print(f"  {row['kernel']}: {row['disposition']} {t}".rstrip(), file=sys.stderr)

    for index in sorted(by_pattern):
        pattern = tuned_pattern(patterns[index])
        unbuilt = [e for e in by_pattern[index] if not e.get("library")]
        by_pattern[index] = [e for e in by_pattern[index] if e.get("library")]
        static_rows = [_unbuilt_row(pattern, arch, problem, e) for e in unbuilt if e.get("config")]
        if not by_pattern[index]:
            why = "; ".join(str(e.get("detail") or e.get("status")) for e in unbuilt)
            print(f"pattern {index}: no kernel to run ({why})", file=sys.stderr)
            all_rows += [{**r, "pattern_index": index} for r in static_rows]
            continue
        if pattern.get("family") not in TUNED_FAMILIES:
            print(
                f"pattern {index}: {pattern.get('family')} kernels are verified and timed in the "
                "composed module (fact.optimize, fact bench), not here",
                file=sys.stderr,
            )
            continue
        print(
            f"pattern {index}: {pattern.get('signature')} ({len(by_pattern[index])} kernels)",
            file=sys.stderr,
        )
        if mode == "default":
            knobs_list = [dict(DEFAULT_KNOBS)]
        rows = tune(
            pattern,
            by_pattern[index],
            precision,
            knobs_list,
            arch=arch,
            problem=problem,
            shapes=shapes,
            reps=args.reps,
            warmup=args.warmup,
            flush=not args.no_flush,
            device=args.device,
            timeout_s=args.timeout,
            progress=report,
            details=details,
        )
        for row in rows + static_rows:
            row["pattern_index"] = index
        attach_advisories(rows + static_rows, by_pattern[index])
        all_rows += rows + static_rows
    command = "python -m fact.tune.harness " + " ".join(argv)
    results = {
        "fact_tune_results": 1,
        "plan": str(plan_path),
        "arch": arch,
        "precision": precision,
        "created": _now(),
        "command": command,
        "environment": details.get("environment", {}),
        "tolerances": {
            "bf16_f16_output": TOL_16BIT_OUTPUT,
            "f32_tf32": TOL_F32_TF32,
            "f32_highest": TOL_F32_HIGHEST,
        },
        "rows": all_rows,
    }
    Path(args.out).write_text(json.dumps(json_safe(results), indent=2) + "\n")
    if args.export:
        Path(args.export).write_text(
            json.dumps(json_safe(registry_export(all_rows, command)), indent=2) + "\n"
        )
    print(format_table(all_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
