"""Probe (GPU machine): an fp32-accurate GEMM as ONE TF32 GEMM over a tripled K.

With x = hi(x) + lo(x), hi the TF32 part (the bits a TF32 tensor core reads), lo the exact
remainder, A @ W^T = hi(A) hi(W)^T + lo(A) hi(W)^T + hi(A) lo(W)^T + lo(A) lo(W)^T, and the last
term is ~2^-22 relative. A TF32 tensor core truncates its fp32 inputs to hi(), so
[A | lo(A) | A] @ [W | W | lo(W)]^T on TF32 math is the first three terms: 3xTF32 on Hopper's
WGMMAs, at the price of materializing the operands with K tripled. This script measures, at the
MiniGPT block's GEMM shapes, that TF32 GEMM (cuBLAS, torch "high") against PyTorch's fp32 GEMM
("highest"), the cost of the split done with PyTorch ops, and the error of each against float64.
Times: CUDA events, median of 20, L2 flushed before each.

With --fact-kernel, the same tripled-K GEMMs also run through one of FACT's TF32 WGMMA kernels
(a realized plain f32 GEMM with K-major operands, e.g. `fact realize
bench/problems/gemm_square_tn.py --dtype fp32 --precision high --candidates 1`): its WGMMAs drop
the low bits of their fp32 inputs instead of rounding them, which the split relies on.

    python3 bench/split_tf32_probe.py [--fact-kernel RUN/lib/KERNEL.so]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

SHAPES = {  # name: (M, N, K), x @ W^T with W [N, K]
    "qkv": (65536, 2304, 768),
    "attn_out": (65536, 768, 768),
    "mlp_up": (65536, 3072, 768),
    "mlp_down": (65536, 768, 3072),
}


def bench(fn, reps=20):
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    times = []
    for i in range(reps + 3):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(s.elapsed_time(e))
    return statistics.median(times)


def hi(x: torch.Tensor, rounded: bool) -> torch.Tensor:
    bits = x.view(torch.int32)
    if rounded:  # round to nearest TF32 (ties away), then drop the low 13 bits
        bits = bits + 0x1000
    return (bits & -8192).view(torch.float32)


def split3(a: torch.Tensor, w: torch.Tensor, rounded: bool, small_first: bool = False):
    """[A | lo(A) | A], [W | W | lo(W)] (hi parts where `rounded`); with `small_first` the two
    small products come first in K: [lo(A) | hi(A) | hi(A)], [hi(W) | lo(W) | hi(W)]."""
    ha, hw = hi(a, rounded), hi(w, rounded)
    first_a = ha if rounded else a
    first_w = hw if rounded else w
    if small_first:
        a3 = torch.cat([a - ha, first_a, first_a], dim=1)
        return a3, torch.cat([first_w, w - hw, first_w], dim=1)
    a3 = torch.cat([first_a, a - ha, first_a], dim=1)
    w3 = torch.cat([first_w, first_w, w - hw], dim=1)
    return a3, w3


def rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


def fact_gemm(lib):
    """a @ w^T (a [M, K], w [N, K], both fp32 and contiguous) through FACT's kernel `lib`."""
    from fact.tune.abi import FactGemmArgs, Status

    def run(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        args = FactGemmArgs()
        args.m, args.n, args.k, args.batch = a.shape[0], w.shape[0], a.shape[1], 1
        args.a, args.lda, args.batch_stride_a = a.data_ptr(), a.shape[1], 0
        args.b, args.ldb, args.batch_stride_b = w.data_ptr(), w.shape[1], 0
        args.d, args.ldd, args.batch_stride_d = out.data_ptr(), out.shape[1], 0
        args.max_swizzle = 1
        nbytes = lib.workspace_size(args)
        workspace = torch.empty(max(nbytes, 1), dtype=torch.uint8, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream
        status = lib.run(args, workspace.data_ptr(), nbytes, stream)
        if status != Status.OK:
            raise RuntimeError(f"{lib.name}: {lib.last_error()}")
        return out

    return run


def measure(m: int, n: int, k: int, fact=None) -> tuple:
    """(fp32 ms, err, TF32 ms, err, {rounded: (3K GEMM ms, split ms, err)}) at one shape."""
    a = torch.randn(m, k, device="cuda")
    w = torch.randn(n, k, device="cuda") / k**0.5
    ref = a.double() @ w.double().T
    torch.set_float32_matmul_precision("highest")
    t_fp32, e_fp32 = bench(lambda: a @ w.T), rel(a @ w.T, ref)
    torch.set_float32_matmul_precision("high")
    t_tf32, e_tf32 = bench(lambda: a @ w.T), rel(a @ w.T, ref)
    split = {}
    for rounded in (False, True):
        a3, w3 = split3(a, w, rounded)
        t_gemm = bench(lambda a3=a3, w3=w3: a3 @ w3.T)
        t_split = bench(lambda r=rounded: split3(a, w, r))
        split[rounded] = (t_gemm, t_split, rel(a3 @ w3.T, ref))
        if fact is not None:
            d = torch.empty(m, n, device="cuda")
            t_fact = bench(lambda a3=a3, w3=w3, d=d: fact(a3, w3, d))
            split[("fact", rounded)] = (t_fact, rel(fact(a3, w3, d), ref))
            t_plain = bench(lambda d=d: fact(a, w, d))
            split[("fact", "tf32")] = (t_plain, rel(fact(a, w, d), ref))
    if fact is not None:  # the small products first in K
        a3, w3 = split3(a, w, True, small_first=True)
        d = torch.empty(m, n, device="cuda")
        t_small = bench(lambda d=d: fact(a3, w3, d))
        split[("fact", "small_first")] = (t_small, rel(fact(a3, w3, d), ref))
    torch.set_float32_matmul_precision("highest")
    return t_fp32, e_fp32, t_tf32, e_tf32, split


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fact-kernel", type=Path, help="a FACT TF32 GEMM library (plain, K-major)")
    args = ap.parse_args()
    fact = None
    if args.fact_kernel:
        from fact.tune.abi import KernelLibrary

        fact = fact_gemm(KernelLibrary(args.fact_kernel))
    torch.manual_seed(0)
    print(
        "| GEMM | M x N x K | fp32 (ms) | err | TF32 (ms) | err | 3K TF32, truncated split: "
        "GEMM (ms) | split (ms) | err | rounded split: GEMM | err |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    facts = []
    for name, (m, n, k) in SHAPES.items():
        t32, e32, ttf, etf, split = measure(m, n, k, fact)
        (tg, ts, et), (tg2, _, et2) = split[False], split[True]
        print(
            f"| {name} | {m}x{n}x{k} | {t32:.3f} | {e32:.1e} | {ttf:.3f} | {etf:.1e} | "
            f"{tg:.3f} | {ts:.3f} | {et:.1e} | {tg2:.3f} | {et2:.1e} |",
            flush=True,
        )
        if fact is not None:
            keys = ("tf32", False, True, "small_first")
            facts.append((name, *(split[("fact", key)] for key in keys)))
        torch.cuda.empty_cache()
    if facts:
        print("\nThrough FACT's TF32 kernel:\n")
        print(
            "| GEMM | TF32 (ms) | err | 3K, truncated split (ms) | err "
            "| 3K, rounded split (ms) | err | 3K, rounded, small products first (ms) | err |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, *cells in facts:
            print(f"| {name} | " + " | ".join(f"{t:.3f} | {e:.1e}" for t, e in cells) + " |")


if __name__ == "__main__":
    main()
