"""GEMM kernels under sustained load: time, SM clock, power and energy per call, FACT's CUTLASS
candidates next to PyTorch's path (cuBLAS) on the same inputs.

The H200 is power-capped (700 W): a long run of dense GEMMs lowers the SM clock until the draw
fits, so under sustained load the kernel that spends less energy per call runs at a higher clock
and wins, whatever its time at full clock (bench/clock_drop.py, bench/README.md, fifth session).
`fact bench` sees this too: its SM clock column differs between modules of one round. This script
measures it per kernel, so that a CUTLASS config can be compared with cuBLAS on both counts.

For each pattern of each realize run directory (bench/realize_gemm.sh or `fact realize`): every
kernel runs back to back for --seconds (after as long a warm-up), without L2 flushes, while NVML is
read every 10 ms (SM clock) and its energy counter is read before and after. Reported per kernel:
time per call (CUDA events around the whole loop), TFLOP/s, the median SM clock, mean power
(NVML's energy over the loop / its time), energy per call, and the time per call scaled to the
maximum clock (time * clock / max clock: the kernel with the power cap taken out, meaningful for
compute-bound kernels only). FACT's kernels run with the default launch knobs, not tuned ones.
PyTorch runs first and again last, to show how much the machine drifted in between. A mean power
above the enforced limit marks a window too short for NVML's energy counter. Correctness is not
checked here: run gemm_bench.py on the same run directories for that.

    python3 bench/gemm_energy.py RUNS_DIR [--only NAME,...] [--seconds 1.0] --out DIR
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

from fact.compose.bench import (  # noqa: E402
    NVML_CLOCK_SM,
    SmClock,
    nvml_device,
    nvml_sm_clock_reader,
)
from fact.tune import harness  # noqa: E402
from fact.tune.inputs import gemm_args, make_inputs, resolve_problem  # noqa: E402
from fact.tune.reference import gemm_spec, pytorch_candidate  # noqa: E402


class Nvml:
    """SM clock (MHz), its maximum, the enforced power limit and the energy counter (mJ) of one
    GPU, through NVML (opened by fact bench's nvml_device)."""

    def __init__(self, index: int):
        opened = nvml_device(index)
        if opened is None:
            raise RuntimeError("NVML is missing or does not know this GPU")
        self.lib, self.handle = opened
        self.clock = nvml_sm_clock_reader(index)  # () -> MHz, 0 when NVML refuses
        value = ctypes.c_uint()
        if self.lib.nvmlDeviceGetMaxClockInfo(self.handle, NVML_CLOCK_SM, ctypes.byref(value)):
            raise RuntimeError("NVML does not give the maximum SM clock")
        self.max_clock = int(value.value)
        limit = ctypes.c_uint()
        ok = self.lib.nvmlDeviceGetEnforcedPowerLimit(self.handle, ctypes.byref(limit)) == 0
        self.power_limit_w = limit.value / 1e3 if ok else None

    def energy_mj(self) -> int:
        value = ctypes.c_ulonglong()
        if self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(value)) != 0:
            return -1
        return int(value.value)


def sustained(fn, nvml: Nvml, seconds: float) -> dict:
    """fn() back to back for `seconds` after as long a warm-up; per-call time, clock, energy."""
    fn()  # first-call costs (library set-up, lazy loading) stay out of the probe
    torch.cuda.synchronize()
    # Calls per second, roughly, from a short probe.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        fn()
    end.record()
    torch.cuda.synchronize()
    per_call_s = start.elapsed_time(end) / 20e3
    calls = max(10, int(seconds / per_call_s))
    for _ in range(calls):  # warm-up: let the clock settle under this kernel's draw
        fn()
    torch.cuda.synchronize()
    with SmClock(torch.device("cuda"), read=nvml.clock) as sm_clock:  # every 10 ms, nonzero kept
        e0 = nvml.energy_mj()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        e1 = nvml.energy_mj()
    us = start.elapsed_time(end) * 1e3 / calls
    clock = statistics.median(sm_clock.samples) if sm_clock.samples else 0
    energy = (e1 - e0) / calls if e0 >= 0 and e1 >= 0 else None
    return {
        "calls": calls,
        "us": us,
        "sm_clock_mhz": clock,
        "energy_mj": energy,
        "watts": energy / us * 1e3 if energy else None,
        "us_at_max_clock": us * clock / nvml.max_clock if clock else None,
    }


def bench_pattern(pattern: dict, entries: list[dict], nvml: Nvml, seconds: float) -> list[dict]:
    spec = gemm_spec(pattern)
    device = torch.device("cuda")
    x = make_inputs(spec, None, device)
    p = x.problem
    flop = 2.0 * p["batch"] * p["m"] * p["n"] * p["k"]
    rows = []

    def torch_row(label: str) -> None:
        with torch.no_grad():
            r = sustained(lambda: pytorch_candidate(spec, x.A, x.B, x.operands), nvml, seconds)
        rows.append({"kernel": label, **r})

    torch_row("pytorch")
    for entry in entries:
        lib, fields = harness.open_candidate(entry, {})
        if lib is None:
            rows.append({"kernel": fields["kernel"], "error": fields.get("message")})
            continue
        args = gemm_args(x, harness.DEFAULT_KNOBS)
        if lib.can_implement(args) != 0:
            rows.append({"kernel": fields["kernel"], "error": lib.last_error()})
            continue
        buf, ptr, nbytes = harness._workspace(lib, args, device)
        stream = torch.cuda.current_stream().cuda_stream

        def launch(lib=lib, args=args, buf=buf, ptr=ptr, nbytes=nbytes, stream=stream) -> None:
            lib.run(args, ptr, nbytes, stream)  # buf: the workspace kept alive

        rows.append({"kernel": fields["kernel"], **sustained(launch, nvml, seconds)})
    torch_row("pytorch (again)")
    for r in rows:
        if r.get("us"):
            r["tflops"] = flop / r["us"] / 1e6
    return rows


def table(
    name: str, signature: str, problem: dict, rows: list[dict], power_limit_w: float | None
) -> str:
    size = f"{problem['m']}x{problem['n']}x{problem['k']}" + (
        f" (batch {problem['batch']})" if problem.get("batch", 1) > 1 else ""
    )
    lines = [
        f"### {name}: `{signature}` {size}",
        "",
        "| kernel | us/call | TFLOP/s | SM clock (MHz) | W | mJ/call | us at max clock "
        "(compute-bound) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    ok = sorted((r for r in rows if r.get("us")), key=lambda r: r["us"])
    for r in ok + [r for r in rows if not r.get("us")]:
        if not r.get("us"):
            lines.append(f"| {r['kernel']} | - ({r.get('error')}) | | | | | |")
            continue
        lines.append(
            "| {} | {:.1f} | {:.0f} | {:.0f} | {} | {} | {:.1f} |".format(
                r["kernel"].replace("fact_gemm_", ""),
                r["us"],
                r["tflops"],
                r["sm_clock_mhz"],
                watts(r.get("watts"), power_limit_w),
                f"{r['energy_mj']:.2f}" if r.get("energy_mj") else "-",
                r["us_at_max_clock"] or 0.0,
            )
        )
    return "\n".join(lines)


def watts(value: float | None, limit: float | None) -> str:
    """Mean power; above the enforced limit it marks a window too short for the energy counter."""
    if not value:
        return "-"
    over = limit is not None and value > limit
    return f"{value:.0f}" + (" (over the limit: window too short)" if over else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, help="folder of realize run directories")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", help="comma-separated run names")
    ap.add_argument("--seconds", type=float, default=1.0, help="measured seconds per kernel")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = sorted(p for p in args.runs.iterdir() if (p / "manifest.json").is_file())
    if (args.runs / "manifest.json").is_file():
        runs = [args.runs]
    if args.only:
        runs = [p for p in runs if p.name in args.only.split(",")]
    nvml = Nvml(torch.cuda.current_device())
    results, sections = [], []
    for run in runs:
        plan = json.loads((run / "plan.json").read_text())
        torch.set_float32_matmul_precision(plan["float32_matmul_precision"])
        entries, _ = harness.load_manifest(run)
        for index, pattern in enumerate(plan["patterns"]):
            mine = [e for e in entries if e.get("pattern_index") == index and e.get("library")]
            if not mine or pattern["family"] not in ("gemm", "batched_gemm"):
                continue
            print(f"== {run.name}: pattern {index} ({len(mine)} kernels)", flush=True)
            t0 = time.perf_counter()
            rows = bench_pattern(pattern, mine, nvml, args.seconds)
            print(f"   {time.perf_counter() - t0:.0f} s", flush=True)
            problem = resolve_problem(gemm_spec(pattern))
            results.append({"run": run.name, "pattern_index": index, "rows": rows})
            sections.append(
                table(run.name, pattern["signature"], problem, rows, nvml.power_limit_w)
            )
    env = harness.environment(torch.device("cuda"))
    record = {"environment": env, "max_sm_clock_mhz": nvml.max_clock, "results": results}
    (args.out / "gemm_energy.json").write_text(json.dumps(record, indent=1))
    text = "\n\n".join(sections)
    (args.out / "gemm_energy.md").write_text(
        f"# GEMMs under sustained load\n\nCommand: `{' '.join(sys.argv)}`\n\n{text}\n"
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
