"""`fact bench PROBLEM.py`: eager vs torch.compile vs FACT on one problem file, in one process.

Each module is timed on the problem's own inputs (CUDA events, L2 flushed before each rep; three
interleaved rounds, the median of the round medians), and its output compared with the model in
float64 on those inputs. The report (markdown,
JSON, PNG) goes into the run directory next to FACT's plan, kernels, logs and transcript.
"""

from __future__ import annotations

import copy
import datetime
import functools
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fact import __version__, timing
from fact.compose import report as report_mod
from fact.compose.optimize import optimize, reference_outputs, rel_err
from fact.errors import FactError
from fact.timing import MIN_REPS

BENCH_REPS = 60
ROUNDS = 3


def _max_abs(out: Any, ref: Any) -> float:
    worst = 0.0
    for o, r in zip(pytree.tree_leaves(out), pytree.tree_leaves(ref), strict=False):
        if isinstance(o, torch.Tensor):
            worst = max(worst, float((o.double() - r.double()).abs().max()))
    return worst


GPU_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")
MARKER = "spin_kernel"  # torch.cuda._sleep's kernel: the backlog launched before each timed call


def kernel_profile(fn, device, iters: int = 5, top: int = 15) -> dict[str, Any]:
    """Where fn's device time goes, under the timing protocol's conditions (L2 flushed and a
    backlog on the GPU before each call): device time per call by kernel, largest first, the
    GPU timeline of each call (see `timeline`) and `host`, the median time the host took to
    issue one call (measured outside the profiler; near the span, the call waits on the GPU)."""
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    from fact.timing import before_timed_call

    if getattr(torch.cuda, "_sleep", None) is None:  # private; its kernel marks each call
        raise FactError(
            f"fact bench --profile needs torch.cuda._sleep, which torch {torch.__version__} "
            "lacks; run without --profile"
        )
    before = before_timed_call(device)
    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                before()
                fn()
            torch.cuda.synchronize()
        host = []  # the host's time to issue one call, outside the profiler
        for _ in range(iters):
            before()
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    calls = split_calls(trace.get("traceEvents") or [])
    by_kernel: dict[str, float] = {}
    counts: dict[str, int] = {}
    for call in calls:
        for e in call:
            by_kernel[e["name"]] = by_kernel.get(e["name"], 0.0) + e["dur"]
            counts[e["name"]] = counts.get(e["name"], 0) + 1
    rows = [
        {
            "kernel": name[:110],
            "calls": counts[name] / max(1, len(calls)),
            "us": us / max(1, len(calls)),
        }
        for name, us in by_kernel.items()
    ]
    rows.sort(key=lambda r: -r["us"])
    result: dict[str, Any] = {
        "kernels": rows[:top],
        "timeline": dict(timeline(calls), host=statistics.median(host)),
    }
    if len(calls) != iters:  # kept, but flagged: the per-call split did not work out
        result["warning"] = (
            f"the trace shows {len(calls)} timed calls, expected {iters}: the {MARKER!r} marker "
            "kernel was not traced as expected, so the per-call figures are unreliable"
        )
    return result


def split_calls(trace_events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The device events of each timed call, from a Chrome trace of `kernel_profile`'s loop:
    each call's events follow a marker kernel; the L2 flush launched just before the next
    marker (the last event on the marker's stream before it) is not the call's. Events are
    {name, ts, dur, stream} (microseconds), in start order, with `lead`: the time from the
    marker's end to the event's start."""
    events = sorted(
        (
            {
                "name": e.get("name", "?"),
                "ts": float(e["ts"]),
                "dur": float(e.get("dur", 0.0)),
                "stream": (e.get("args") or {}).get("stream"),
            }
            for e in trace_events
            if e.get("ph") == "X" and e.get("cat") in GPU_EVENTS
        ),
        key=lambda e: e["ts"],
    )
    marks = [i for i, e in enumerate(events) if MARKER in e["name"]]
    calls = []
    for k, i in enumerate(marks):
        marker = events[i]
        segment = events[i + 1 : marks[k + 1] if k + 1 < len(marks) else len(events)]
        if k + 1 < len(marks):  # drop the next call's flush
            same = [j for j, e in enumerate(segment) if e["stream"] == marker["stream"]]
            if same:
                segment = segment[: same[-1]] + segment[same[-1] + 1 :]
        end = marker["ts"] + marker["dur"]
        calls.append([dict(e, lead=e["ts"] - end) for e in segment])
    return calls


def timeline(calls: list[list[dict[str, Any]]], gaps: int = 6) -> dict[str, Any]:
    """Per call: `lead` (marker's end to the first kernel: the host was late), `span` (first
    kernel's start to the last one's end), `busy` (time some kernel ran) and `idle` (span -
    busy). Each is the median over calls (so idle need not equal span - busy of the medians);
    `gaps` are the median call's largest idle gaps, each with the kernel that ended last before
    it and the one that starts it. Empty when no call ran a kernel."""
    stats = []
    for call in calls:
        if not call:
            continue
        end = call[0]["ts"]
        busy = 0.0
        holes = []
        last = None  # the event that ended last so far
        for e in call:
            if e["ts"] > end and last is not None:
                holes.append(
                    {"us": e["ts"] - end, "after": last["name"][:80], "before": e["name"][:80]}
                )
            start = max(e["ts"], end)
            busy += max(0.0, e["ts"] + e["dur"] - start)
            if last is None or e["ts"] + e["dur"] > end:
                last = e
            end = max(end, e["ts"] + e["dur"])
        span = end - call[0]["ts"]
        holes.sort(key=lambda h: -h["us"])
        stats.append(
            {
                "lead": call[0]["lead"],
                "span": span,
                "busy": busy,
                "idle": span - busy,
                "gaps": holes[:gaps],
                "events": len(call),
            }
        )
    if not stats:
        return {}
    mid = sorted(stats, key=lambda s: s["span"])[len(stats) // 2]
    out = {k: statistics.median(s[k] for s in stats) for k in ("lead", "span", "busy", "idle")}
    out["events"] = mid["events"]
    out["gaps"] = mid["gaps"]
    return out


def round_order(items: list, r: int) -> list:
    """The order of round r: the items rotated by r, reversed first in odd rounds when there are
    more than two (rotation alone keeps four modules' neighbours). With two to four modules over
    three rounds no module follows the same one in every round."""
    order = items[::-1] if r % 2 and len(items) > 2 else list(items)
    start = r % len(order) if order else 0
    return order[start:] + order[:start]


class SmClock:
    """The GPU's SM clock (MHz), read through NVML every few milliseconds while the block runs,
    for the record: a module timed while the clock was low reads slower (bench/clock_drop.py).
    `samples` stays empty where NVML is missing or refuses; timing never depends on it."""

    def __init__(
        self,
        device: torch.device,
        period_s: float = 0.01,
        read: Callable[[], int] | None = None,  # tests pass their own readers
        reasons: Callable[[], int | None] | None = None,
    ):
        self.samples: list[int] = []
        self.limits: list[int] = []  # NVML's clock event reasons with each sample, where known
        self._period = period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._read = read or _nvml_sm_clock(device)
        self._reasons = reasons if read is not None else _nvml_clock_reasons(device)

    def __enter__(self) -> SmClock:
        if self._read is not None:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _sample(self) -> None:
        while not self._stop.is_set():
            mhz = self._read()
            if mhz:
                self.samples.append(mhz)
                mask = self._reasons() if self._reasons is not None else None
                if mask is not None:
                    self.limits.append(mask)
            self._stop.wait(self._period)

    def summary(self) -> dict[str, Any] | None:
        """min, median and max of the samples; None without any. With NVML's reasons,
        `limits`: what held the clock back (power cap, thermal, ...; idle left out) and in what
        share of the samples."""
        if not self.samples:
            return None
        out: dict[str, Any] = {
            "min": min(self.samples),
            "median": int(statistics.median(self.samples)),
            "max": max(self.samples),
        }
        if self.limits:
            shares = {}
            for bit, name in CLOCK_LIMITS.items():
                n = sum(1 for m in self.limits if m & bit)
                if n and name != "idle":
                    shares[name] = round(n / len(self.limits), 2)
            out["limits"] = shares
        return out


# NVML's clock event reasons (nvmlClocksEventReasons; "throttle reasons" in older drivers)
CLOCK_LIMITS = {
    0x1: "idle",
    0x2: "application clocks",
    0x4: "power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "thermal",
    0x40: "hardware thermal",
    0x80: "power brake",
    0x100: "display clocks",
}


def _cuda_index(device: torch.device) -> int | None:
    """The CUDA device index `device` names (the current one where it names none), or None
    without CUDA."""
    try:
        return device.index if device.index is not None else torch.cuda.current_device()
    except Exception:  # noqa: BLE001 - no CUDA here: nothing to read
        return None


def _nvml_sm_clock(device: torch.device) -> Callable[[], int] | None:
    """A reader of the device's current SM clock through the driver's NVML library, or None."""
    index = _cuda_index(device)
    return None if index is None else nvml_sm_clock_reader(index)


def _nvml_clock_reasons(device: torch.device) -> Callable[[], int | None] | None:
    """A reader of the device's current clock event reasons (a CLOCK_LIMITS bit mask) through
    NVML, or None."""
    import ctypes

    index = _cuda_index(device)
    opened = None if index is None else nvml_device(index)
    if opened is None:
        return None
    nvml, handle = opened
    # the newer name, or the older one where the driver lacks it
    fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    if fn is None:
        return None
    mask = ctypes.c_ulonglong()

    def read() -> int | None:
        return int(mask.value) if fn(handle, ctypes.byref(mask)) == 0 else None

    return read


@functools.cache
def nvml_device(index: int) -> tuple[Any, Any] | None:
    """(the driver's NVML library, the handle of CUDA device `index`), or None where NVML is
    missing or refuses. Opened once per process and device."""
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
        uuid = f"GPU-{torch.cuda.get_device_properties(index).uuid}".encode()
        handle = ctypes.c_void_p()
        if nvml.nvmlDeviceGetHandleByUUID(uuid, ctypes.byref(handle)) != 0:
            return None
    except Exception:  # noqa: BLE001 - best effort: the readings are for the record only
        return None
    return nvml, handle


@functools.cache
def nvml_sm_clock_reader(index: int) -> Callable[[], int] | None:
    """A reader of CUDA device `index`'s SM clock (MHz; 0 when NVML refuses), or None."""
    import ctypes

    opened = nvml_device(index)
    if opened is None:
        return None
    nvml, handle = opened
    clock = ctypes.c_uint()

    def read() -> int:
        ok = nvml.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM, ctypes.byref(clock)) == 0
        return int(clock.value) if ok else 0

    return read


NVML_CLOCK_SM = 1  # nvmlClockType_t


def run_bench(
    problem_path: str,
    *,
    dtype: str | None,
    precision: str,
    out: Path,
    candidates: int = 4,
    compile_baseline: bool = True,
    cuda_graphs: bool = True,
    reps: int = BENCH_REPS,
    quiet: bool = False,
    command: str = "",
    profile: bool = False,
    fold_norms: bool = False,
    compare_pdl: bool = False,
) -> dict[str, Any]:
    from fact.problem import load_problem
    from fact.tune.harness import environment

    if not torch.cuda.is_available():
        raise FactError(
            "fact bench times kernels on a GPU; this machine has no CUDA device "
            "(fact discover and fact realize work without one)"
        )
    device = torch.device("cuda")
    torch.set_float32_matmul_precision(precision)
    problem = load_problem(problem_path, dtype)
    model = problem.model.to(device).eval()
    inputs = [t.to(device) if isinstance(t, torch.Tensor) else t for t in problem.inputs]
    opt = optimize(
        model,
        inputs,
        precision=precision,
        candidates=candidates,
        run_dir=out,
        cuda_graphs=cuda_graphs,
        quiet=quiet,
        fold_norms=fold_norms,
    )

    def say(msg: str) -> None:
        if not quiet:
            print(f"[fact bench] {msg}", file=sys.stderr, flush=True)

    # The workload is the problem's own inputs (its get_inputs()); optimize verified the module
    # on other, fresh random inputs already.
    data = inputs
    say("reference: the model in float64")
    ref = reference_outputs(model, data)
    with torch.no_grad():
        eager_out = model(*data)
    if ref is None:
        ref = eager_out
    modules: list[tuple[str, Any, str]] = [("eager", model, "")]
    if compile_baseline:
        say("torch.compile (default mode): compiling")
        modules.append(("torch.compile", torch.compile(model), ""))
    mode = "CUDA graph replay" if opt.cuda_graphs else "plain launches"
    if opt.use_original:  # optimize's guard (step 8): the original ran faster than FACT's
        mode = "the original module, which ran faster than the composed one in optimize"
    modules.append(("fact", opt, mode))
    if opt.use_original:
        composed = copy.copy(opt)
        composed.use_original = False
        modules.append(("fact, composed (not chosen)", composed, ""))
    replay = opt.report.get("replay") or {}
    if cuda_graphs and not replay.get("error"):  # the launch mode optimize did not choose
        other = copy.copy(opt)
        other.use_original = False
        other.cuda_graphs = not opt.cuda_graphs
        modules.append(
            ("fact (CUDA graph)" if other.cuda_graphs else "fact (no CUDA graph)", other, "")
        )
    if compare_pdl:  # each FACT module again, its kernels launched plainly (ops.py)
        for name, module, _ in [m for m in modules if m[0].startswith("fact")]:
            plain = copy.copy(module)
            plain.pdl = False
            modules.append((name.replace("fact", "fact, no PDL", 1), plain, ""))
    results = []
    for name, module, note in modules:
        with torch.no_grad():
            module(*data)  # warm up (compiles torch.compile's graph, captures FACT's)
            result = module(*data)
        results.append(
            {
                "name": name,
                "rel_error": rel_err(result, ref),
                "max_abs_error": _max_abs(result, ref),
                "note": note,
                "rounds_us": [],
                "rounds_sm_clock_mhz": [],
            }
        )
        del result
    # Interleaved rounds, so that clocks and heat treat every module alike, in an order that
    # changes from round to round so that no module always follows the same one (the power cap
    # lowers the clock after a module that draws much, bench/README.md).
    # Both protocols each round (fact.timing): per call (L2 flushed, synchronized; time_us) and
    # back to back; then the host's time per call, with the GPU kept busy.
    per_round = max(MIN_REPS, reps // ROUNDS)
    turns = list(zip(results, modules, strict=True))
    for row in results:
        row["rounds_back_to_back_us"] = []
    for r in range(ROUNDS):
        for row, (name, module, _) in round_order(turns, r):
            say(f"timing {name} (round {r + 1}/{ROUNDS})")
            with torch.no_grad(), SmClock(device) as clock:
                per_call, b2b = timing.measure_turn(lambda m=module: m(*data), device, per_round)
            row["rounds_us"].append(per_call)
            row["rounds_back_to_back_us"].append(b2b)
            row["rounds_sm_clock_mhz"].append(clock.summary())
    for row, (_, module, _) in turns:
        row["time_us"] = statistics.median(row["rounds_us"])
        row["back_to_back_us"] = statistics.median(row["rounds_back_to_back_us"])
        with torch.no_grad():
            row["host_us"] = statistics.median(timing.host_times(lambda m=module: m(*data), device))
    profiles = {}
    if profile:
        for name, module, _ in modules:
            say(f"profiling {name}")
            profiles[name] = kernel_profile(lambda m=module: m(*data), device)
    bench = {
        "fact_bench": 2,
        "problem": str(problem_path),
        "model": problem.name,
        "dtype": dtype or str(next(model.parameters()).dtype).removeprefix("torch."),
        "precision": precision,
        "command": command,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "fact_version": __version__,
        "environment": environment(device),
        "reps": reps,
        "results": results,
        "optimize": opt.report,
        "profile": profiles,
    }
    files = report_mod.write(report_mod.json_ready(bench), out)
    say(f"report: {', '.join(str(p) for p in files.values())}")
    return bench


def summary_table(bench: dict[str, Any]) -> str:
    """Per module: per-call ms (the protocol benchmark sets use) with its ratios, back-to-back
    ms with its ratio to eager, host us per call and the error against float64."""
    rows = bench["results"]
    eager = rows[0]
    compiled = next((r for r in rows if r["name"] == "torch.compile"), None)
    lines = [
        f"{'module':24} {'per call':>9} {'vs eager':>9} {'vs compile':>11} {'b2b':>8} "
        f"{'vs eager':>9} {'vs compile':>11} {'host us':>8} {'rel err':>9}"
    ]

    def ratio(base: dict[str, Any] | None, r: dict[str, Any], key: str) -> str:
        if base is None or not base.get(key) or not r.get(key):
            return "-"
        return f"{base[key] / r[key]:.2f}x"

    for r in rows:
        b2b = r.get("back_to_back_us")
        host = r.get("host_us")
        lines.append(
            f"{r['name']:24} {r['time_us'] / 1e3:9.3f} {ratio(eager, r, 'time_us'):>9} "
            f"{ratio(compiled, r, 'time_us'):>11} "
            f"{(b2b / 1e3 if b2b else float('nan')):8.3f} {ratio(eager, r, 'back_to_back_us'):>9} "
            f"{ratio(compiled, r, 'back_to_back_us'):>11} "
            f"{(host if host is not None else float('nan')):8.1f} {r['rel_error']:9.2e}"
        )
    return "\n".join(lines)


__all__ = ["run_bench", "summary_table"]
