"""Time every generated row-norm kernel (LayerNorm, RMSNorm) of realized run directories against
PyTorch's own op, on the GPU machine.

The tuner leaves row norms to the composed module (they are timed in context by `fact.optimize`),
so `gemm_bench.py` skips them; this script compares their block shapes by themselves. Each kernel
is checked against a float32 reference first (relative error, bf16/f16 outputs under 2e-2, f32
under 1e-5). Times: CUDA events, median of the repetitions, L2 flushed before each
(`fact.tune.harness.time_fn`).

    python3 bench/norm_bench.py RUN_DIR [RUN_DIR ...] [--rows 65536] [--reps 30] [--pdl]

--pdl adds each kernel launched as a programmatic dependent (FactNormArgs.pdl), alone (L2 flushed
before each, as above) and in a chain: CHAIN launches back to back with no flush, the time per
launch, plain and dependent.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from fact.compose.ops import NormKernel, _norm_reference  # noqa: E402
from fact.tune import harness  # noqa: E402
from fact.tune.abi import FactNormArgs, KernelLibrary, Status  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def pytorch_norm(info: dict, x, w, b, eps: float):
    if info["kind"] == "rms_norm":
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def reference(info: dict, x, w, b, eps: float):
    """In float32 (fact::norm's PyTorch twin, not rounded to the kernel's output type),
    rounding where the kernel's spec says the model rounds."""
    rounds = info.get("round_before_weight")
    entry = NormKernel(info["kind"], info["cols"], eps, torch.float32, "reference",
                       round_to=DTYPES[info["dtype_round"]] if rounds else None)  # fmt: skip
    return _norm_reference(entry, x, w, b)


CHAIN = 20


def chain_us(run, reps: int) -> float:
    """Median over reps of (CHAIN launches back to back, no flush) / CHAIN, in us."""
    for _ in range(3):
        run()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(CHAIN):
            run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CHAIN)
    return statistics.median(times)


def bench_library(path: Path, rows: int, reps: int, pdl: bool = False) -> dict:
    lib = KernelLibrary(path)
    info = lib.info
    cols, eps = info["cols"], 1e-5
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(rows, cols, device="cuda", generator=gen).to(DTYPES[info["dtype_in"]])
    wdt = DTYPES.get(info.get("dtype_weight") or "f32", torch.float32)
    w = torch.randn(cols, device="cuda", generator=gen).to(wdt) if info["has_weight"] else None
    b = torch.randn(cols, device="cuda", generator=gen).to(wdt) if info["has_bias"] else None
    out = torch.full((rows, cols), float("nan"), device="cuda", dtype=DTYPES[info["dtype_out"]])
    args = FactNormArgs()
    args.rows, args.cols = rows, cols
    args.x, args.ldx = x.data_ptr(), cols
    args.weight = w.data_ptr() if w is not None else None
    args.bias = b.data_ptr() if b is not None else None
    args.out, args.ldout, args.eps = out.data_ptr(), cols, eps
    if lib.norm_can_implement(args) != Status.OK:
        return {"kernel": lib.name, "error": lib.last_error()}
    stream = torch.cuda.current_stream().cuda_stream

    def run():
        lib.check(lib.norm_run(args, stream))

    run()
    torch.cuda.synchronize()
    err, why = harness.rel_err(out, reference(info, x, w, b, eps))
    bound = 1e-5 if info["dtype_out"] == "f32" else 2e-2
    dev = torch.device("cuda")
    t = statistics.median(harness.time_fn(run, reps=reps, warmup=3, flush=True, device=dev))
    with torch.no_grad():
        t_torch = statistics.median(
            harness.time_fn(
                lambda: pytorch_norm(info, x, w, b, eps),
                reps=reps,
                warmup=3,
                flush=True,
                device=dev,
            )
        )
    moved = x.numel() * x.element_size() + out.numel() * out.element_size()
    launches = {}
    if pdl:
        for dependent in (0, 1):
            args.pdl = dependent
            alone = harness.time_fn(run, reps=reps, warmup=3, flush=True, device=dev)
            launches[dependent] = (statistics.median(alone), chain_us(run, reps))
        args.pdl = 0
    return {
        "launches": launches,
        "kernel": lib.name,
        "config": info.get("config", {}).get("name", "?"),
        "us": t,
        "torch_us": t_torch,
        "tb_s": moved / (t * 1e-6) / 1e12,
        "rel_err": err,
        "ok": err <= bound,
        "why": why,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories of `fact realize`")
    ap.add_argument("--rows", type=int, default=65536)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--pdl", action="store_true", help="also time programmatic dependent launches")
    args = ap.parse_args()
    seen, results = set(), []
    for run in args.runs:
        for lib in sorted((run / "lib").glob("fact_*_norm_*.so")):
            if lib.name in seen:  # the same kernel for two patterns
                continue
            seen.add(lib.name)
            results.append(bench_library(lib, args.rows, args.reps, args.pdl))
    print(f"rows {args.rows}; {torch.cuda.get_device_name()}; torch {torch.__version__}\n")
    print("| kernel | config | us | PyTorch us | vs PyTorch | TB/s | rel err | verified |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        if "error" in r:
            print(f"| {r['kernel']} | - | - | - | - | - | - | refused: {r['error']} |")
            continue
        print(
            f"| {r['kernel']} | {r['config']} | {r['us']:.1f} | {r['torch_us']:.1f} | "
            f"{r['torch_us'] / r['us']:.2f}x | {r['tb_s']:.2f} | {r['rel_err']:.1e} | "
            f"{'yes' if r['ok'] else 'NO ' + r['why']} |"
        )
    if args.pdl:
        print(
            f"\nPlain and programmatic dependent launches (us): alone, L2 flushed before each; "
            f"chained, {CHAIN} launches back to back, per launch.\n"
        )
        print("| kernel | config | alone, plain | alone, dependent | chain, plain | chain, dep. |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in results:
            if r.get("launches"):
                (a0, c0), (a1, c1) = r["launches"][0], r["launches"][1]
                times = " | ".join(f"{t:.1f}" for t in (a0, a1, c0, c1))
                print(f"| {r['kernel']} | {r['config']} | {times} |")
    return 0 if all(r.get("ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
