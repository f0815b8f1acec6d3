"""Burst against sustained timing of a block's GEMM candidates on the GPU machine.

The tuner times each candidate in short bursts: a GPU spin and an L2 flush before every call,
20 calls, so the GPU idles between them and the SM clock stays near its 1980 MHz maximum. A
composed block runs its kernels back to back for as long as the caller asks, and on the H200
that holds the clock at the 700 W power cap (1400-1700 MHz in the zoo runs). A kernel that
draws less energy per call keeps a higher clock there, so the burst ranking need not be the
sustained one. This measures both for every verified candidate, in the same process:

- burst: the tuner's own rows (harness.tune: verification on fresh random inputs, then the
  median over its launch knobs, L2 flushed and a spin before each call);
- sustained: the candidate with its best knobs launched back to back for --seconds (after a
  warm-up of the same length), timed by CUDA events around the whole run, with NVML's energy
  counter read before and after and the SM clock sampled throughout. Candidates take turns
  over --rounds rounds whose order rotates; the median over rounds is shown.

    python3 bench/sustained.py RUN_DIR [RUN_DIR ...] --out $OUT/sustained

RUN_DIR: a `fact realize` run directory (plan.json, manifest.json, compiled kernels). Prints one
table per GEMM pattern last, writes sustained.json and sustained.md to --out.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

import torch  # noqa: E402

from fact.compose.bench import SmClock, _cuda_index, nvml_device  # noqa: E402
from fact.tune import harness  # noqa: E402
from fact.tune.runs import tuned_pattern  # noqa: E402


def energy_reader(device: torch.device):
    """A reader of the GPU's energy counter (mJ since the driver loaded), or None."""
    index = _cuda_index(device)
    opened = None if index is None else nvml_device(index)
    if opened is None:
        return None
    nvml, handle = opened
    value = ctypes.c_ulonglong()

    def read() -> int | None:
        ok = nvml.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(value)) == 0
        return int(value.value) if ok else None

    return read if read() is not None else None


def sustained(fn, calls: int, device: torch.device, energy) -> dict:
    """fn() `calls` times back to back: ms a call, mJ a call, the SM clock meanwhile."""
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with SmClock(device) as clock:
        e0 = energy() if energy else None
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        e1 = energy() if energy else None
    ms = start.elapsed_time(end) / calls
    summary = clock.summary() or {}
    return {
        "ms": ms,
        "mj": (e1 - e0) / calls if e0 is not None and e1 is not None else None,
        "mhz": summary.get("median"),
        "power_cap": (summary.get("limits") or {}).get("power cap"),
    }


def launcher(row: dict, pattern: dict, inputs, device: torch.device):
    """A zero-argument launch of one tuned row (a FACT kernel with its knobs, or PyTorch) and
    the check that raises if a kernel launch failed."""
    from fact.tune.reference import gemm_spec, pytorch_candidate

    if row["kernel"] == "pytorch":
        spec = gemm_spec(pattern)
        return lambda: pytorch_candidate(spec, inputs.A, inputs.B, inputs.operands), lambda: None
    return harness.kernel_launcher(row["library"], inputs, row.get("knobs"), device)


def bench_pattern(pattern: dict, entries: list[dict], precision: str, args) -> dict:
    from fact.tune.inputs import make_inputs

    device = torch.device("cuda")
    rows = harness.tune(pattern, entries, precision, None, reps=args.reps, timeout_s=240)
    ok = [r for r in rows if r["disposition"] == "passed" or r["kernel"] == "pytorch"]
    inputs = make_inputs(pattern, dict(pattern["problem"]), device)
    launches = {}
    for r in ok:
        launches[r["kernel"]] = launcher(r, pattern, inputs, device)
    energy = energy_reader(device)
    per = {name: [] for name in launches}
    for rnd in range(args.rounds):
        names = list(launches)
        names = names[rnd % len(names) :] + names[: rnd % len(names)]
        for name in names:
            fn, check = launches[name]
            burst_ms = next(r["time_us"] for r in ok if r["kernel"] == name) / 1e3
            calls = max(20, int(args.seconds / (burst_ms / 1e3)))
            sustained(fn, calls, device, energy)  # warm-up: the clock settles
            per[name].append(sustained(fn, calls, device, energy))
            check()
            time.sleep(args.rest)
    out = []
    for r in ok:
        runs = per[r["kernel"]]

        def med(key: str, runs: list[dict] = runs) -> float | None:
            values = [x[key] for x in runs if x[key] is not None]
            return statistics.median(values) if values else None

        out.append(
            {
                "kernel": r["kernel"],
                "knobs": r.get("knobs"),
                "burst_us": r["time_us"],
                "sustained_us": med("ms") * 1e3,
                "mj_per_call": med("mj"),
                "mhz": med("mhz"),
                "power_cap": med("power_cap"),
                "rounds": runs,
            }
        )
    verified = {
        r["kernel"]: {"disposition": r["disposition"], "error": r.get("error")}
        for r in rows
        if r["kernel"] != "pytorch"
    }
    return {
        "signature": pattern["signature"],
        "problem": pattern["problem"],
        "verified": verified,
        "rows": out,
    }


def table(result: dict) -> str:
    rows = result["rows"]
    burst_rank = {r["kernel"]: i for i, r in enumerate(sorted(rows, key=lambda r: r["burst_us"]))}
    verified = result["verified"]
    passed = sum(1 for v in verified.values() if v["disposition"] == "passed")
    shown = {r["kernel"] for r in rows}
    others = ", ".join(f"{k}: {v['disposition']}" for k, v in verified.items() if k not in shown)
    lines = [
        f"### `{result['signature']}` {result['problem']}",
        "",
        f"{passed} of {len(verified)} kernels verified" + (f"; {others}" if others else ""),
        "",
        "| kernel | burst (us) | rank | sustained (us) | rank | mJ/call | SM MHz | power capped |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(sorted(rows, key=lambda r: r["sustained_us"])):
        mj = f"{r['mj_per_call']:.1f}" if r["mj_per_call"] is not None else "-"
        cap = f"{r['power_cap']:.2f}" if r["power_cap"] is not None else "-"
        lines.append(
            f"| {r['kernel']} | {r['burst_us']:.1f} | {burst_rank[r['kernel']] + 1} | "
            f"{r['sustained_us']:.1f} | {i + 1} | {mj} | {r['mhz'] or '-'} | {cap} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seconds", type=float, default=1.0, help="each sustained run (default 1)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rest", type=float, default=0.5, help="idle seconds between runs")
    p.add_argument("--reps", type=int, default=harness.MIN_REPS)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for run in args.runs:
        plan = json.loads((run / "plan.json").read_text())
        entries, _ = harness.load_manifest(run)
        for index, pattern in enumerate(plan["patterns"]):
            mine = [
                e
                for e in entries
                if e.get("pattern_index") == index
                and e.get("library")
                and tuned_pattern(pattern, e).get("family") == "gemm"
            ]
            if not mine:
                continue
            print(f"== {run.name}: pattern {index} {pattern['signature']}", flush=True)
            # the PyTorch row runs in this process: TF32 where the plan's precision allows it
            torch.set_float32_matmul_precision(plan["float32_matmul_precision"])
            tuned = tuned_pattern(pattern, mine[0])
            results.append(
                {"run": run.name, "index": index}
                | bench_pattern(tuned, mine, plan["float32_matmul_precision"], args)
            )
            (args.out / "sustained.json").write_text(json.dumps(results, indent=1))
    text = "\n\n".join(table(r) for r in results)
    (args.out / "sustained.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
