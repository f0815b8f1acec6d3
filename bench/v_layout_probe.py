"""Probe (GPU machine): what it would cost the MiniGPT block in TF32 to produce V already
transposed, instead of transposing it before the attention.

Hopper's TF32 WGMMAs read only K-major operands, so FACT's TF32 FMHA copies V (batch, seq, heads,
dim) into (batch, heads, dim, seq) before its P @ V (117 us of the attention's 465 at the MiniGPT
shape, bench/README.md, ninth session). The projection that makes V could write it that way
itself: V^T = W_v @ x^T + b_v is a GEMM with M = heads * dim and N = tokens whose output,
(heads * dim, batch * seq) row-major, is every (batch, head)'s V^T with keys contiguous. The
block's fused QKV projection would then run as two GEMMs over slices of its weight: q and k
(N = 1536) and V^T. This script times, with cuBLAS standing in for FACT's GEMMs:

- the fused projection alone (N = 2304),
- the fused projection and a transposing copy of V (PyTorch's `contiguous()`),
- the split form: q and k, then V^T as its own GEMM,

and checks that the split form's V^T equals the transposed V. Times: CUDA events, median of 20,
L2 flushed before each (fact.tune.harness.time_fn; call 1 of results/2026-12-01-v-layout ran
an earlier copy with its own 256 MB flush, the same protocol).

    python3 bench/v_layout_probe.py [--dtype fp32|bf16]   # fp32 runs under "high" (TF32)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from fact.tune import harness  # noqa: E402

B, S, H, D = 128, 512, 8, 96  # the MiniGPT block's attention (shared/BENCHMARKS.md)
C = H * D


def bench(fn, reps: int = 20) -> float:
    """Median us of fn() (fact.tune.harness.time_fn: CUDA events, L2 flushed before each)."""
    times = harness.time_fn(fn, reps=reps, warmup=3, flush=True, device=torch.device("cuda"))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    args = ap.parse_args()
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    torch.set_float32_matmul_precision("high")
    torch.manual_seed(0)
    x = torch.randn(B * S, C, device="cuda", dtype=dtype)
    w = (torch.randn(3 * C, C, device="cuda") / C**0.5).to(dtype)
    b = torch.randn(3 * C, device="cuda", dtype=dtype)
    w_qk, b_qk, w_v, b_v = w[: 2 * C], b[: 2 * C], w[2 * C :], b[2 * C :]  # views: no copies

    def fused():
        return F.linear(x, w, b)

    def fused_then_transpose():
        qkv = F.linear(x, w, b)
        return qkv, qkv.view(B, S, 3, H, D)[:, :, 2].permute(0, 2, 3, 1).contiguous()

    def split():
        qk = F.linear(x, w_qk, b_qk)
        vt = torch.addmm(b_v[:, None], w_v, x.T)  # (H * D, B * S): V^T per (batch, head)
        return qk, vt

    with torch.no_grad():
        _, vt_ref = fused_then_transpose()
        _, vt = split()
        # vt[h * D + d, b * S + s] against vt_ref[b, h, d, s]
        got = vt.view(H, D, B, S).permute(2, 0, 1, 3)
        err = ((got.double() - vt_ref.double()).norm() / vt_ref.double().norm()).item()
        rows = [
            ("fused QKV projection (N = 2304)", bench(fused)),
            ("fused, then V transposed (contiguous)", bench(fused_then_transpose)),
            ("q, k (N = 1536) only", bench(lambda: F.linear(x, w_qk, b_qk))),
            ("V^T = W_v x^T + b_v only", bench(lambda: torch.addmm(b_v[:, None], w_v, x.T))),
            ("split: q, k, then V^T", bench(split)),
        ]
    print(f"dtype {args.dtype} (fp32 under 'high': TF32), {torch.cuda.get_device_name()}")
    print(f"split V^T against the transposed V: relative difference {err:.1e}\n")
    print("| step | time (us) |\n| --- | --- |")
    for name, t in rows:
        print(f"| {name} | {t:.1f} |")


if __name__ == "__main__":
    main()
