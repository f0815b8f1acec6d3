"""GEMM benchmarks of shared/BENCHMARKS.md on the GPU machine: FACT's kernels vs eager PyTorch
(cuBLAS) and torch.compile, side by side in one run.

Takes the run directories that bench/realize_gemm.sh made on the CPU machine (plan, manifest,
compiled kernels). For each: the tuning harness verifies every kernel on fresh random inputs
(fault-isolated) and times the survivors over their launch knobs; then the problem's own module
is timed eagerly and under torch.compile in this process. Times: CUDA events, median of the
repetitions, L2 flushed before each. Prints a table last; writes JSON and markdown to --out.

    python3 bench/gemm_bench.py .device/bench --out $OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

import torch  # noqa: E402

from fact.problem import load_problem  # noqa: E402
from fact.tune import harness  # noqa: E402


def time_module(fn, inputs, reps: int) -> float:
    device = torch.device("cuda")
    return statistics.median(
        harness.time_fn(lambda: fn(*inputs), reps=reps, warmup=5, flush=True, device=device)
    )


def bench_run(run: Path, reps: int) -> dict:
    plan = json.loads((run / "plan.json").read_text())
    entries, _ = harness.load_manifest(run)
    precision = plan["float32_matmul_precision"]
    rows = []
    for index, pattern in enumerate(plan["patterns"]):
        mine = [e for e in entries if e.get("pattern_index") == index and e.get("library")]
        if not mine:
            continue
        print(
            f"== {run.name}: pattern {index} {pattern['signature']} ({len(mine)} kernels)",
            flush=True,
        )
        rows += harness.tune(pattern, mine, precision, None, reps=reps, timeout_s=240)
    passed = [r for r in rows if r["disposition"] == "passed" and r["kernel"] != "pytorch"]
    best = min(passed, key=lambda r: r["time_us"]) if passed else None
    # The module itself, eager and compiled, in this process and this run.
    torch.set_float32_matmul_precision(precision)
    dtype = {"bf16": "bf16", "f16": "fp16", "f32": "fp32"}[plan["dtype"]]
    problem = load_problem(REPO / plan["source"], dtype)
    model = problem.model.cuda()
    inputs = [t.cuda() for t in problem.inputs]
    with torch.no_grad():
        eager_us = time_module(model, inputs, reps)
        start = time.perf_counter()
        compiled = torch.compile(model)
        compiled(*inputs)
        compile_s = time.perf_counter() - start
        compiled_us = time_module(compiled, inputs, reps)
    return {
        "run": run.name,
        "source": plan["source"],
        "dtype": plan["dtype"],
        "precision": precision,
        "eager_us": eager_us,
        "compile_us": compiled_us,
        "compile_s": compile_s,
        "fact_us": best["time_us"] if best else None,
        "fact_kernel": best["kernel"] if best else None,
        "fact_knobs": best.get("knobs") if best else None,
        "fact_rel_err": best["error"] if best else None,
        "rows": rows,
    }


def table(results: list[dict]) -> str:
    lines = [
        "| workload | dtype | precision | eager (ms) | torch.compile (ms) | FACT (ms) | vs eager | "
        "vs compile | FACT kernel | rel err |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        fact = r["fact_us"]
        cells = [
            Path(r["source"]).stem,
            r["dtype"],
            r["precision"],
            f"{r['eager_us'] / 1e3:.3f}",
            f"{r['compile_us'] / 1e3:.3f}",
            f"{fact / 1e3:.3f}" if fact else "-",
            f"{r['eager_us'] / fact:.2f}x" if fact else "-",
            f"{r['compile_us'] / fact:.2f}x" if fact else "-",
            (r["fact_kernel"] or "-").replace("fact_gemm_", ""),
            f"{r['fact_rel_err']:.1e}" if r["fact_rel_err"] is not None else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, help="folder of realize run directories")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--only", help="comma-separated run names")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = sorted(p for p in args.runs.iterdir() if (p / "manifest.json").is_file())
    if args.only:
        runs = [p for p in runs if p.name in args.only.split(",")]
    env = harness.environment(torch.device("cuda"))
    results = []
    for run in runs:
        results.append(bench_run(run, args.reps))
        doc = {"command": " ".join(sys.argv), "environment": env, "results": results}
        (args.out / "gemm_bench.json").write_text(json.dumps(harness.json_safe(doc), indent=1))
    md = table(results)
    (args.out / "gemm_bench.md").write_text(
        f"command: `{' '.join(sys.argv)}`\n\nenvironment: `{json.dumps(env)}`\n\n{md}\n"
    )
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
