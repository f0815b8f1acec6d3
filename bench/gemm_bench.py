"""Kernel benchmarks of shared/BENCHMARKS.md on the GPU machine (GEMMs, and attention through
bench/realize_attention.sh): FACT's kernels vs eager PyTorch and torch.compile, side by side in
one run. For attention the tuner's PyTorch candidate is scaled_dot_product_attention.

Takes the run directories that bench/realize_gemm.sh made on the CPU machine (plan, manifest,
compiled kernels). For each: the tuning harness verifies every kernel on fresh random inputs
(fault-isolated) and times the survivors over their launch knobs; then the problem's own module
is timed eagerly and under torch.compile in this process. For a plain GEMM problem the best
kernel is also timed on the module's own inputs, in rounds with eager and torch.compile
(same_inputs: the tuner's random data draws a different power than get_inputs()'s). Times:
CUDA events, median of the repetitions, L2 flushed before each. Prints the tables last; writes
JSON and markdown to --out.

    python3 bench/gemm_bench.py .device/bench --out $OUT
"""

from __future__ import annotations

import argparse
import inspect
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
from fact.tune.runs import tuned_pattern  # noqa: E402


def time_module(fn, inputs, reps: int) -> float:
    device = torch.device("cuda")
    return statistics.median(
        harness.time_fn(lambda: fn(*inputs), reps=reps, warmup=5, flush=True, device=device)
    )


def module_operands(pattern: dict, model, inputs: list) -> tuple | None:
    """A plain GEMM pattern's A and B as views of the module's own inputs, or None.

    The tuner times kernels on its own random data (normal, B scaled by 1/sqrt(k)); the
    problems' modules get theirs from get_inputs() (torch.rand). Tensor cores draw a different
    power on different bits, and under the H200's power cap that moves the clock: the same
    cuBLAS kernel measured 4 % apart on the two (GEMM run 8). So each side is timed on the
    module's data too. An operand is the forward argument of its node's name, else the other
    argument that has its shape, or its transpose for a column-major operand (q @ w.t());
    the caller checks the kernel's result against the module's before trusting the mapping.
    """
    from fact.tune.reference import gemm_spec

    spec = gemm_spec(pattern)
    if spec.operands:
        return None
    names = list(inspect.signature(model.forward).parameters)[: len(inputs)]
    args = dict(zip(names, inputs, strict=True))
    prob = pattern["problem"]
    lead = (prob["batch"],) if prob["batch"] > 1 else ()
    logical = {"a": (prob["m"], prob["k"]), "b": (prob["k"], prob["n"])}
    layouts = {"a": spec.layout_a, "b": spec.layout_b}
    taken: set[str] = set()
    found = {}
    for o in sorted(pattern["operands"], key=lambda o: o["node"] not in args):
        role = o["role"]
        rows, cols = logical[role]
        stored = (*lead, rows, cols) if layouts[role] == "row" else (*lead, cols, rows)
        pick = [o["node"]] if o["node"] in args else [n for n in names if n not in taken]
        name = next((n for n in pick if tuple(args[n].shape) == stored), None)
        if name is None:
            return None
        taken.add(name)
        t = args[name]
        found[role] = t if layouts[role] == "row" else t.transpose(-1, -2)
    return found["a"], found["b"]


def same_inputs(
    pattern: dict, row: dict, model, compiled, inputs: list, reps: int, precision: str
) -> dict | None:
    """eager, torch.compile and the best FACT kernel on the module's own inputs, in three
    rounds whose order rotates (fact bench's round_order); medians of the round medians."""
    from fact.compose.bench import round_order
    from fact.tune.abi import KernelLibrary
    from fact.tune.inputs import GemmInputs
    from fact.tune.reference import gemm_spec

    operands = module_operands(pattern, model, inputs)
    if operands is None:
        return None
    a, b = operands
    spec = gemm_spec(pattern)
    expected = model(*inputs)
    out = torch.empty(expected.shape, dtype=a.dtype, device=a.device)
    gemm = GemmInputs(spec, dict(pattern["problem"]), a, b, [], out, 0, a.device)
    lib = KernelLibrary(row["library"])

    def fact_time(reps: int) -> float:
        return harness.time_kernel(lib, pattern, knobs=row["knobs"], reps=reps, inputs=gemm)

    fact_time(harness.MIN_REPS)  # warm-up, and the output to check
    err, why = harness.rel_err(gemm.D, expected.double())
    del expected
    if not err <= harness.tolerance(pattern, precision):
        return {"error": f"the kernel's output on the module's inputs is off: {err:.3g} {why}"}
    timers = {
        "eager": lambda: time_module(model, inputs, reps),
        "compile": lambda: time_module(compiled, inputs, reps),
        "fact": lambda: fact_time(reps),
    }
    rounds: dict[str, list[float]] = {k: [] for k in timers}
    for r in range(3):
        for name in round_order(list(timers), r):
            rounds[name].append(timers[name]())
    result = {f"{k}_us": statistics.median(v) for k, v in rounds.items()}
    return {**result, "rounds": rounds, "rel_err": err}


def sdpa_alone(pattern: dict, reps: int) -> dict:
    """scaled_dot_product_attention by itself on the tuner's inputs: the library kernel alone,
    without the model's layout step after it that the tuner's PyTorch row includes (a copy
    only where SDPA's output is not already in the pattern's layout)."""
    from fact.tune.attention import AttentionSpec, make_inputs, pytorch_attention

    spec = AttentionSpec.from_pattern(pattern)
    x = make_inputs(spec, "cuda")
    with torch.no_grad():
        t = statistics.median(
            harness.time_fn(
                lambda: pytorch_attention(spec, x.q, x.k, x.v),
                reps=reps,
                warmup=5,
                flush=True,
                device=torch.device("cuda"),
            )
        )
    return {"kernel": "sdpa_alone", "disposition": "timed", "time_us": t}


def bench_run(run: Path, reps: int, module: bool = True) -> dict:
    plan = json.loads((run / "plan.json").read_text())
    entries, _ = harness.load_manifest(run)
    precision = plan["float32_matmul_precision"]
    rows = []
    skipped = []
    for index, pattern in enumerate(plan["patterns"]):
        built = [e for e in entries if e.get("pattern_index") == index and e.get("library")]
        # The kernels the harness tunes: GEMM-family (a gated MLP's lowered GEMM) and attention.
        # Row norms and pointwise regions (a gated MLP's tail) are measured in the composed
        # module (`fact bench`).
        mine = [
            e for e in built if tuned_pattern(pattern, e).get("family") in harness.TUNED_FAMILIES
        ]
        if len(mine) < len(built):
            print(
                f"== {run.name}: pattern {index} {pattern['signature']}: "
                f"{len(built) - len(mine)} kernels skipped (measured in the composed module)",
                flush=True,
            )
            skipped.append(index)
        if not mine:
            continue
        print(
            f"== {run.name}: pattern {index} {pattern['signature']} ({len(mine)} kernels)",
            flush=True,
        )
        # timeout_s: seconds a candidate may go without progress (harness.DEFAULT_TIMEOUT_S)
        tuned = harness.tune(
            tuned_pattern(pattern), mine, precision, None, reps=reps, timeout_s=240
        )
        rows += [{**r, "pattern_index": index} for r in tuned]
        if pattern["family"] == "attention":
            rows.append({**sdpa_alone(pattern, reps), "pattern_index": index})
    # Per pattern: the fastest verified FACT kernel against the unfused PyTorch path.
    patterns = []
    for index, pattern in enumerate(plan["patterns"]):
        mine = [r for r in rows if r.get("pattern_index") == index]
        if not mine:
            continue
        ok = [r for r in mine if r["disposition"] == "passed" and r["kernel"] != "pytorch"]
        alone = next((r for r in mine if r["kernel"] == "sdpa_alone"), None)
        torch_row = next((r for r in mine if r["kernel"] == "pytorch"), None)
        best_row = min(ok, key=lambda r: r["time_us"]) if ok else None
        patterns.append(
            {
                "index": index,
                "signature": pattern["signature"],
                "pytorch_us": torch_row["time_us"] if torch_row else None,
                "sdpa_alone_us": alone["time_us"] if alone else None,
                "fact_us": best_row["time_us"] if best_row else None,
                "kernel": best_row["kernel"] if best_row else None,
                "knobs": best_row.get("knobs") if best_row else None,
                "rel_err": best_row["error"] if best_row else None,
                "dispositions": sorted(
                    {r["disposition"] for r in mine if r["kernel"] not in ("pytorch", "sdpa_alone")}
                ),
            }
        )
    # The module as FACT would run it: every pattern's best kernel, when patterns cover all the
    # compute (true for these GEMM problems) and each has a verified kernel.
    covered = (
        not plan["pytorch_nodes"]
        and not skipped
        and patterns
        and all(p["fact_us"] for p in patterns)
    )
    fact_total = sum(p["fact_us"] for p in patterns) if covered else None
    best = min((p for p in patterns if p["fact_us"]), key=lambda p: p["fact_us"], default=None)
    # The module itself, eager and compiled, in this process and this run (not with
    # --kernels-only: comparisons of kernel variants skip torch.compile's minutes).
    torch.set_float32_matmul_precision(precision)
    dtype = {"bf16": "bf16", "f16": "fp16", "f32": "fp32"}[plan["dtype"]]
    eager_us = compiled_us = compile_s = same = None
    if module:
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
            pattern = plan["patterns"][patterns[0]["index"]] if len(patterns) == 1 else None
            if covered and pattern is not None and pattern["family"] == "gemm":
                best_row = min(
                    (r for r in rows if r["disposition"] == "passed" and r["kernel"] != "pytorch"),
                    key=lambda r: r["time_us"],
                )
                same = same_inputs(pattern, best_row, model, compiled, inputs, reps, precision)
    return {
        "run": run.name,
        "source": plan["source"],
        "dtype": plan["dtype"],
        "precision": precision,
        "eager_us": eager_us,
        "compile_us": compiled_us,
        "compile_s": compile_s,
        "fact_us": fact_total,
        "fact_kernel": best["kernel"]
        if best and len(patterns) == 1
        else f"{len(patterns)} kernels",
        "fact_rel_err": max(
            (p["rel_err"] for p in patterns if p["rel_err"] is not None), default=None
        ),
        "patterns": patterns,
        "same_inputs": same,
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
        if r["eager_us"] is None:  # --kernels-only
            continue
        cells = [
            Path(r["source"]).stem,
            r["dtype"],
            r["precision"],
            f"{r['eager_us'] / 1e3:.3f}",
            f"{r['compile_us'] / 1e3:.3f}",
            f"{fact / 1e3:.3f}" if fact else "-",
            f"{r['eager_us'] / fact:.2f}x" if fact else "-",
            f"{r['compile_us'] / fact:.2f}x" if fact else "-",
            (r["fact_kernel"] or "-").replace("fact_gemm_", "").replace("fact_attention_", ""),
            f"{r['fact_rel_err']:.1e}" if r["fact_rel_err"] is not None else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    same = [r for r in results if r.get("same_inputs")]
    if same:
        lines += [
            "",
            "On the module's own inputs (get_inputs()), eager, torch.compile and the FACT kernel "
            "above in three rounds of rotating order, median of the round medians:",
            "",
            "| workload | dtype | eager (ms) | torch.compile (ms) | FACT (ms) | vs eager | "
            "vs compile | rel err vs eager |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in same:
            x = r["same_inputs"]
            if "error" in x:
                lines.append(f"| {Path(r['source']).stem} | {r['dtype']} | {x['error']} |")
                continue
            e, c, f = x["eager_us"], x["compile_us"], x["fact_us"]
            lines.append(
                f"| {Path(r['source']).stem} | {r['dtype']} | {e / 1e3:.3f} | {c / 1e3:.3f} | "
                f"{f / 1e3:.3f} | {e / f:.2f}x | {c / f:.2f}x | {x['rel_err']:.1e} |"
            )
    lines += [
        "",
        "Per pattern, against the unfused PyTorch path of the same pattern (same process; for "
        "attention: scaled_dot_product_attention plus the model's layout step, and SDPA "
        "alone):",
        "",
        "| workload | pattern | PyTorch (us) | SDPA alone (us) | FACT (us) | speedup | "
        "FACT kernel | rel err |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        for p in r["patterns"]:
            t, f = p["pytorch_us"], p["fact_us"]
            cells = [
                r["run"],
                p["signature"],
                f"{t:.1f}" if t else "-",
                f"{p['sdpa_alone_us']:.1f}" if p.get("sdpa_alone_us") else "-",
                f"{f:.1f}" if f else "- (" + ", ".join(p["dispositions"]) + ")",
                f"{t / f:.2f}x" if t and f else "-",
                (p["kernel"] or "-").replace("fact_gemm_", "").replace("fact_attention_", ""),
                f"{p['rel_err']:.1e}" if p["rel_err"] is not None else "-",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, help="folder of realize run directories")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--only", help="comma-separated run names")
    ap.add_argument(
        "--kernels-only",
        action="store_true",
        help="time the kernels and SDPA only, not the modules eagerly and under torch.compile",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = sorted(p for p in args.runs.iterdir() if (p / "manifest.json").is_file())
    if args.only:
        runs = [p for p in runs if p.name in args.only.split(",")]
    env = harness.environment(torch.device("cuda"))
    results = []
    for run in runs:
        results.append(bench_run(run, args.reps, module=not args.kernels_only))
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
