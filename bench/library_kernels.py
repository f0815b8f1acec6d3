"""Which kernels PyTorch's own path launches for the GEMM benchmarks (cuBLAS/cuBLASLt names carry
their tile, cluster and schedule), through torch.profiler on the GPU machine.

    python3 bench/library_kernels.py [--dtype bf16|tf32]

Prints one line per problem: the problem, then each CUDA kernel of one call with its time.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

PROBLEMS = {  # name: (a shape, b shape) as the bench/problems modules multiply them
    "square 4096": ((4096, 4096), (4096, 4096)),
    "batched 128x512x1024x2048": ((128, 512, 1024), (128, 1024, 2048)),
    "large-K 256x256x524288": ((256, 524288), (524288, 256)),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=("bf16", "tf32"), default="bf16")
    args = p.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.set_float32_matmul_precision("high")
    for name, (sa, sb) in PROBLEMS.items():
        a = torch.randn(sa, device="cuda", dtype=dtype)
        b = torch.randn(sb, device="cuda", dtype=dtype)
        if args.dtype == "tf32":  # B K-major, as bench/problems/*_tn.py: a @ w.t()
            b = b.transpose(-1, -2).contiguous().transpose(-1, -2)
        for _ in range(3):
            torch.matmul(a, b)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            torch.matmul(a, b)
            torch.cuda.synchronize()
        kernels = [
            (e.name, e.device_time_total)
            for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA
        ]
        print(f"{args.dtype} {name}:")
        for kname, us in kernels:
            print(f"  {us:8.1f} us  {kname}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
