"""`fact bench PROBLEM.py`: eager vs torch.compile vs FACT on one problem file, in one process.

Each module is timed on the problem's own inputs (CUDA events, L2 flushed before each rep; three
interleaved rounds, the median of the round medians), and its output compared with the model in
float64 on those inputs. The report (markdown,
JSON, PNG) goes into the run directory next to FACT's plan, kernels, logs and transcript.
"""

from __future__ import annotations

import copy
import datetime
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from fact import __version__
from fact.compose import report as report_mod
from fact.compose.optimize import optimize, reference_outputs, rel_err, time_us
from fact.errors import FactError
from fact.tune.harness import MIN_REPS

BENCH_REPS = 60
ROUNDS = 3


def _max_abs(out: Any, ref: Any) -> float:
    worst = 0.0
    for o, r in zip(pytree.tree_leaves(out), pytree.tree_leaves(ref), strict=False):
        if isinstance(o, torch.Tensor):
            worst = max(worst, float((o.double() - r.double()).abs().max()))
    return worst


def kernel_profile(fn, iters: int = 5, top: int = 15) -> list[dict[str, Any]]:
    """Device time per call of fn, by kernel (torch.profiler), largest first."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if total <= 0 or e.key.startswith("ProfilerStep"):
            continue
        rows.append({"kernel": e.key[:110], "calls": e.count / iters, "us": total / iters})
    rows.sort(key=lambda r: -r["us"])
    return rows[:top]


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
    modules.append(("fact", opt, "CUDA graph replay" if opt.cuda_graphs else "plain launches"))
    if opt.cuda_graphs:  # the same composed module without the replay, for the record
        plain = copy.copy(opt)
        plain.cuda_graphs = False
        modules.append(("fact (no CUDA graph)", plain, ""))
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
            }
        )
        del result
    # Interleaved rounds, so that clocks and heat treat every module alike.
    per_round = max(MIN_REPS, reps // ROUNDS)
    for r in range(ROUNDS):
        for row, (name, module, _) in zip(results, modules, strict=True):
            say(f"timing {name} (round {r + 1}/{ROUNDS})")
            with torch.no_grad():
                row["rounds_us"].append(time_us(lambda m=module: m(*data), device, per_round))
    for row in results:
        row["time_us"] = statistics.median(row["rounds_us"])
    profiles = {}
    if profile:
        say("profiling kernels (eager, fact without CUDA graph)")
        cg, opt.cuda_graphs = opt.cuda_graphs, False
        profiles = {
            "eager": kernel_profile(lambda: model(*data)),
            "fact": kernel_profile(lambda: opt(*data)),
        }
        opt.cuda_graphs = cg
    bench = {
        "fact_bench": 1,
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
    rows = bench["results"]
    eager = rows[0]["time_us"]
    compiled = next((r["time_us"] for r in rows if r["name"] == "torch.compile"), None)
    lines = [f"{'module':24} {'ms':>8} {'vs eager':>9} {'vs compile':>11} {'rel err':>9}"]
    for r in rows:
        vs_c = f"{compiled / r['time_us']:.2f}x" if compiled else "-"
        lines.append(
            f"{r['name']:24} {r['time_us'] / 1e3:8.3f} {eager / r['time_us']:8.2f}x "
            f"{vs_c:>11} {r['rel_error']:9.2e}"
        )
    return "\n".join(lines)


__all__ = ["run_bench", "summary_table"]
