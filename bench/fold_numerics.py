"""Why `fact/folds.py` folds LayerNorms into bf16/fp16 GEMMs but not into TF32 ones: the
folded form's error against float64, as the rows' mean grows against their spread, on the CPU.

The fold computes o = rstd * (x @ (W*g)^T - mean * c1) + c2 (see `fact/folds.py`). Its GEMM
multiplies x itself where the model multiplies the normalised y = (x - mean) * rstd * g + beta.
This script emulates the tensor cores' operand rounding on the CPU, for one projection of a
MiniGPT-sized layer (K 768, N 2304, uniform weights, gamma 1 +- 0.1), and prints the relative
error of each form against float64 for rows x = offset + N(0, 1):

- bf16: x and W * g are rounded to bf16 once (bf16 x bf16 products are exact in the f32
  accumulator); c1 is summed from the rounded W * g, as the fold does.
- TF32: both GEMM operands are read with 10 mantissa bits, truncated (what the tensor cores do
  with f32 in shared memory) or rounded to nearest (the best a conversion pass could do).

    python3 bench/fold_numerics.py [--rows 4096]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F


def tf32_truncated(t: torch.Tensor) -> torch.Tensor:
    bits = t.float().contiguous().view(torch.int32)
    return (bits & ~((1 << 13) - 1)).view(torch.float32)


def tf32_nearest(t: torch.Tensor) -> torch.Tensor:
    bits = t.float().contiguous().view(torch.int32)
    return ((bits + (1 << 12)) & ~((1 << 13) - 1)).view(torch.float32)


def bf16(t: torch.Tensor) -> torch.Tensor:
    return t.bfloat16().float()


def errors(x, w, b, g, beta, operand) -> tuple[float, float]:
    """(unfolded, folded) relative errors against float64, GEMM operands through `operand`."""
    k = x.shape[-1]
    ref = F.linear(F.layer_norm(x.double(), [k], g.double(), beta.double()), w.double(), b.double())
    y = F.layer_norm(x, [k], g, beta)
    unfolded = operand(y) @ operand(w).T + b
    mean = x.double().mean(1, keepdim=True).float()
    rstd = (x.double().var(1, unbiased=False, keepdim=True) + 1e-5).rsqrt().float()
    wg = operand(w * g)
    c1 = wg.double().sum(1).float()
    c2 = w @ beta + b
    folded = rstd * (operand(x) @ wg.T - mean * c1) + c2

    def rel(o: torch.Tensor) -> float:
        return ((o.double() - ref).norm() / ref.norm()).item()

    return rel(unfolded), rel(folded)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096)
    args = ap.parse_args()
    torch.manual_seed(0)
    k, n = 768, 2304
    w = (torch.rand(n, k) * 2 - 1) / k**0.5
    b = (torch.rand(n) * 2 - 1) / k**0.5
    g, beta = 1 + 0.1 * torch.randn(k), 0.1 * torch.randn(k)
    forms = {"bf16": bf16, "TF32 truncated": tf32_truncated, "TF32 nearest": tf32_nearest}
    print("| operands | row mean / spread | unfolded | folded | folded / unfolded |")
    print("| --- | --- | --- | --- | --- |")
    for name, operand in forms.items():
        for offset in (0, 1, 3, 10, 30, 100):
            x = offset + torch.randn(args.rows, k)
            if operand is bf16:
                x = bf16(x)
            un, fo = errors(x, w, b, g, beta, operand)
            print(f"| {name} | {offset} | {un:.2e} | {fo:.2e} | {fo / un:.1f}x |")


if __name__ == "__main__":
    main()
