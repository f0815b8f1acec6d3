"""How FACT times work on the GPU: the two protocols users measure with, and the kernel protocol
tuning uses. Every choice FACT makes about a module (a pattern's implementation, CUDA graph
replay or plain launches, the composed module or the original) is timed with both user
protocols and kept only where it wins under both (`Timing.beats`).

  per call      each call alone, as benchmark sets (KernelBench) and latency-bound callers see
                it: L2 flushed, the device idle (synchronized), CUDA events around the call,
                synchronized again. The host's time before its first launch is in the figure.
  back to back  the host runs ahead, as in a throughput loop: `calls` calls between two events,
                one synchronize, time / calls. Host time counts only where it exceeds the
                GPU's.
  kernel        device time alone: L2 flushed, then a spin kernel queued before the call, so the
                host's side of the launch happens while the GPU is busy (tuning compares kernels
                with it; it hides host overhead on purpose).

On a CPU device (the tests' PyTorch twins of kernels) each protocol takes wall-clock time.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fact.errors import FactError

MIN_REPS = 20  # the median of at least this many repetitions
FLUSH_BYTES = 256 << 20  # written before a flushed call: far more than the H200's 60 MB L2
# GPU spin before each kernel-protocol call (~20 us at ~2 GHz), so that the host's side of the
# launch (ctypes, CUTLASS's initialize) happens while the GPU is busy, never timed.
BACKLOG_CYCLES = 40_000
# GPU spin before each host-time measurement (~25 ms): long enough that no call of a model
# waits for the GPU while its host time is read.
HOST_BACKLOG_CYCLES = 50_000_000
BACK_TO_BACK_CALLS = 20
#: Timing.beats: a ratio within this of 1 is a tie
TIE = 0.005

_FLUSH: dict[str, Any] = {}


def _flush_buffer(device):
    import torch

    key = str(device)
    if key not in _FLUSH:
        _FLUSH[key] = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
    return _FLUSH[key]


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _wall(fn: Callable[[], Any], reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return times


def _on(device):
    """The device's context for events and streams (a no-op on the CPU)."""
    import contextlib

    import torch

    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _check_reps(reps: int) -> None:
    if reps < MIN_REPS:
        raise FactError(f"timing needs at least {MIN_REPS} repetitions, got {reps}")


def before_timed_call(device, flush: bool = True) -> Callable[[], None]:
    """What precedes every kernel-protocol call on a CUDA device: the L2 flush (when `flush`;
    every call then reads from HBM), then a backlog on the GPU (torch.cuda._sleep: private but
    long-standing, skipped where missing), so the host enqueues the call while the GPU is busy."""
    import torch

    buf = _flush_buffer(device) if flush else None
    sleep = getattr(torch.cuda, "_sleep", None)

    def before() -> None:
        if buf is not None:
            buf.zero_()
        if sleep is not None:
            sleep(BACKLOG_CYCLES)

    return before


def kernel_times(
    fn: Callable[[], Any], *, reps: int, warmup: int, flush: bool, device
) -> list[float]:
    """Per-rep device times (us) of fn() under the kernel protocol."""
    import torch

    _check_reps(reps)
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        return _wall(fn, reps)
    with _on(device):
        sync(device)
        before = before_timed_call(device, flush)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for start, end in zip(starts, ends, strict=True):
            before()
            start.record()
            fn()
            end.record()
        sync(device)
        return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True)]


def per_call_times(
    fn: Callable[[], Any], device, *, reps: int = MIN_REPS, warmup: int = 3, flush: bool = True
) -> list[float]:
    """Per-rep times (us) of fn() called alone: L2 flushed, device idle, events, synchronize."""
    import torch

    _check_reps(reps)
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        return _wall(fn, reps)
    buf = _flush_buffer(device) if flush else None
    times = []
    with _on(device):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(reps):
            if buf is not None:
                buf.zero_()
            torch.cuda.synchronize(device)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) * 1e3)
    return times


def back_to_back_times(
    fn: Callable[[], Any],
    device,
    *,
    rounds: int = 5,
    calls: int = BACK_TO_BACK_CALLS,
    warmup: int = 3,
) -> list[float]:
    """Per-call times (us) of `rounds` runs of `calls` calls each, issued back to back between
    two events with no synchronize in between."""
    import torch

    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        return [statistics.mean(_wall(fn, calls)) for _ in range(rounds)]
    times = []
    with _on(device):
        for _ in range(rounds):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) * 1e3 / calls)
    return times


def host_times(
    fn: Callable[[], Any], device, *, reps: int = 60, per_backlog: int = 20
) -> list[float]:
    """Wall-clock time (us) the host spends in each of `reps` calls of fn() while the GPU is
    busy with earlier work (so no launch waits for it): the host overhead a synchronizing caller
    pays on top of the GPU. The calls run in runs of `per_backlog` behind one long GPU spin; the
    first call after a synchronize can be slower than the rest by far more than any launch, so
    one call per spin would time that wake-up rather than the call."""
    import torch

    fn()
    sleep = getattr(torch.cuda, "_sleep", None) if device.type == "cuda" else None
    times = []
    with _on(device):
        for i in range(reps):
            if i % per_backlog == 0:
                sync(device)
                if sleep is not None:
                    sleep(HOST_BACKLOG_CYCLES)
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        sync(device)
    return times


@dataclass
class Timing:
    """One thing timed under both user protocols: medians over turns (us)."""

    per_call_us: float
    back_to_back_us: float
    per_call_turns: list[float] = field(default_factory=list)
    back_to_back_turns: list[float] = field(default_factory=list)

    def beats(self, other: Timing, tie: float = TIE) -> bool:
        """Faster than `other` under both protocols: faster by more than `tie` (a fraction)
        under at least one and not slower by more than `tie` under the other. Differences
        within `tie` are ties, which a remeasurement could flip either way: they never decide."""
        ratios = (
            self.per_call_us / other.per_call_us if other.per_call_us else math.inf,
            self.back_to_back_us / other.back_to_back_us if other.back_to_back_us else math.inf,
        )
        return all(r <= 1 + tie for r in ratios) and any(r < 1 - tie for r in ratios)

    def score(self) -> float:
        """One number to rank candidates that all beat the baseline: the mean of the two."""
        return (self.per_call_us + self.back_to_back_us) / 2

    def as_dict(self) -> dict[str, Any]:
        return {
            "per_call_us": self.per_call_us,
            "back_to_back_us": self.back_to_back_us,
            "per_call_turns_us": self.per_call_turns,
            "back_to_back_turns_us": self.back_to_back_turns,
        }


def measure_turn(fn: Callable[[], Any], device, reps: int = MIN_REPS) -> tuple[float, float]:
    """One turn of both protocols: (per-call median, back-to-back median), us."""
    per_call = statistics.median(per_call_times(fn, device, reps=reps))
    rounds = max(3, reps // BACK_TO_BACK_CALLS + 2)
    b2b = statistics.median(back_to_back_times(fn, device, rounds=rounds))
    return per_call, b2b


def take_turns(
    fns: dict[Any, Callable[[], Any]],
    device,
    rounds: int = 3,
    reps: int = MIN_REPS,
    errors: dict[Any, str] | None = None,
) -> dict[Any, Timing]:
    """Each callable timed under both protocols, `rounds` turns in alternating order (so clock
    drift favours none of them); medians over the turns. With `errors`, a callable that raises
    is left out from then on and its error recorded there; without, the exception propagates."""
    turns: dict[Any, tuple[list[float], list[float]]] = {key: ([], []) for key in fns}
    order = list(fns.items())
    for r in range(rounds):
        for key, fn in reversed(order) if r % 2 else order:
            if errors is not None and key in errors:
                continue
            try:
                pc, b2b = measure_turn(fn, device, reps)
            except Exception as exc:
                if errors is None:
                    raise
                errors[key] = f"{type(exc).__name__}: {exc}"
                continue
            turns[key][0].append(pc)
            turns[key][1].append(b2b)
    return {
        key: Timing(statistics.median(pc), statistics.median(b2b), pc, b2b)
        for key, (pc, b2b) in turns.items()
        if pc and (errors is None or key not in errors)
    }


__all__ = [
    "MIN_REPS",
    "Timing",
    "back_to_back_times",
    "before_timed_call",
    "host_times",
    "kernel_times",
    "measure_turn",
    "per_call_times",
    "take_turns",
]
