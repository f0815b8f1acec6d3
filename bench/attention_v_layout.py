"""Time each attention kernel of realized run directories with V as the model's projection
leaves it (head dim contiguous) and with V keys-contiguous, as a projection that writes V^T
would leave it (ABI version 4's v_stride_d), on the GPU machine.

Hopper's TF32 kernels transpose V into their workspace unless its keys are contiguous; this
shows what reading it in place saves. Both layouts are verified against the reference first
(relative error within the pattern's tolerance). Times: CUDA events, median of the
repetitions, L2 flushed before each (`fact.tune.harness.time_fn`), the tuner's inputs
(`fact.tune.attention.make_inputs`) at the plan's problem.

    python3 bench/attention_v_layout.py RUN_DIR [RUN_DIR ...] [--reps 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from fact.tune import harness  # noqa: E402
from fact.tune.abi import KernelLibrary  # noqa: E402
from fact.tune.attention import (  # noqa: E402
    AttentionSpec,
    args_for,
    as_keys_contiguous,
    make_inputs,
    reference,
    run_kernel,
)
from fact.tune.harness import tolerance  # noqa: E402


def bench_run(run: Path, reps: int, precision: str | None) -> list[dict]:
    plan = json.loads((run / "plan.json").read_text())
    precision = precision or plan.get("float32_matmul_precision", "highest")
    entries, _ = harness.load_manifest(run)
    rows = []
    dev = torch.device("cuda")
    for entry in entries:
        pattern = plan["patterns"][entry["pattern_index"]]
        if pattern["family"] != "attention" or not entry.get("library"):
            continue
        spec = AttentionSpec.from_pattern(pattern)
        lib = KernelLibrary(entry["library"])
        x = make_inputs(spec, "cuda")
        ref = reference(spec, x.q, x.k, x.v)
        tol = tolerance(pattern, precision)
        row = {"run": run.name, "kernel": lib.name}
        # a plan rewritten by fact.layouts already has V keys-contiguous: each layout explicitly
        layouts = {"head dim contiguous": x.v.contiguous()}
        if lib.info.get("v_keys_contiguous"):
            layouts["keys contiguous"] = as_keys_contiguous(x.v)
        for name, v in layouts.items():
            args = args_for(x.q, x.k, v, x.o, spec.scale)
            workspace = torch.empty(
                max(lib.attention_workspace_size(args), 1), dtype=torch.uint8, device=dev
            )
            x.o.fill_(float("nan"))
            run_kernel(lib, x.q, x.k, v, x.o, spec, workspace)
            torch.cuda.synchronize()
            err, why = harness.rel_err(x.o, ref)
            t = statistics.median(
                harness.time_fn(
                    lambda lib=lib, x=x, v=v, spec=spec, w=workspace: run_kernel(
                        lib, x.q, x.k, v, x.o, spec, w
                    ),
                    reps=reps,
                    warmup=3,
                    flush=True,
                    device=dev,
                )
            )
            row[name] = {"us": t, "rel_err": err, "ok": err <= tol, "why": why}
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--precision", help="default: the plan's float32 matmul precision")
    args = ap.parse_args()
    rows = [r for run in args.runs for r in bench_run(run, args.reps, args.precision)]
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}\n")
    print(
        "| run | kernel | V head dim contiguous (us) | V keys contiguous (us) | saved | rel err |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    ok = True
    for r in rows:
        a, b = r["head dim contiguous"], r.get("keys contiguous")
        row_ok = a["ok"] and (b is None or b["ok"])
        ok &= row_ok
        errs = f"{a['rel_err']:.1e}" + (f" / {b['rel_err']:.1e}" if b else "")
        print(
            f"| {r['run']} | {r['kernel']} | {a['us']:.1f} | "
            + (f"{b['us']:.1f} | {a['us'] - b['us']:.1f} us" if b else "refused | -")
            + f" | {errs}{'' if row_ok else ' FAILED'} |"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
