"""Probe (GPU machine): an fp32-accurate GEMM as ONE TF32 GEMM over a tripled K.

With x = hi(x) + lo(x), hi the TF32 part (the bits a TF32 tensor core reads), lo the exact
remainder, A @ W^T = hi(A) hi(W)^T + lo(A) hi(W)^T + hi(A) lo(W)^T + lo(A) lo(W)^T, and the last
term is ~2^-22 relative. A TF32 tensor core truncates its fp32 inputs to hi(), so
[A | lo(A) | A] @ [W | W | lo(W)]^T on TF32 math is the first three terms: 3xTF32 on Hopper's
WGMMAs, at the price of materializing the operands with K tripled. This script measures, at the
MiniGPT block's GEMM shapes, that TF32 GEMM (cuBLAS, torch "high") against PyTorch's fp32 GEMM
("highest"), the cost of the split done with PyTorch ops, and the error of each against float64.
Times: CUDA events, median of 20, L2 flushed before each.

    python3 bench/split_tf32_probe.py
"""

from __future__ import annotations

import statistics

import torch

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


def split3(a: torch.Tensor, w: torch.Tensor, rounded: bool):
    ha, hw = hi(a, rounded), hi(w, rounded)
    first_a = ha if rounded else a
    first_w = hw if rounded else w
    a3 = torch.cat([first_a, a - ha, first_a], dim=1)
    w3 = torch.cat([first_w, first_w, w - hw], dim=1)
    return a3, w3


def rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


def measure(m: int, n: int, k: int) -> tuple:
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
    torch.set_float32_matmul_precision("highest")
    return t_fp32, e_fp32, t_tf32, e_tf32, split


def main():
    torch.manual_seed(0)
    print(
        "| GEMM | M x N x K | fp32 (ms) | err | TF32 (ms) | err | 3K TF32, truncated split: "
        "GEMM (ms) | split (ms) | err | rounded split: GEMM | err |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, (m, n, k) in SHAPES.items():
        t32, e32, ttf, etf, split = measure(m, n, k)
        (tg, ts, et), (tg2, _, et2) = split[False], split[True]
        print(
            f"| {name} | {m}x{n}x{k} | {t32:.3f} | {e32:.1e} | {ttf:.3f} | {etf:.1e} | "
            f"{tg:.3f} | {ts:.3f} | {et:.1e} | {tg2:.3f} | {et2:.1e} |",
            flush=True,
        )
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
