"""Host time of one GEMM call through each layer of a composed module, on the GPU machine.

    python3 bench/host_overhead.py --plan RUN/plan.json --pattern N --library RUN/lib/KERNEL.so

The plan and the kernel library come from `fact realize` (any GEMM pattern of the plan and one of
its compiled kernels). Each layer is called 200 times while about a second of GPU work is queued
ahead of it, so no call waits for the GPU; the median per call is printed, in microseconds:

- `can_implement`, `workspace_size`, `run`: the kernel's C ABI alone (ctypes; `run` enqueues);
- `gemm_args`: packing the argument block from tensors;
- `body`: the fact::gemm op's Python body (checks, output allocation, packing, launch), as a
  composed module calls it when it runs eagerly;
- `torch.ops.fact.gemm`: the same call through PyTorch's dispatcher, as a traced graph calls it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from fact.compose import ops  # noqa: E402
from fact.tune.abi import KernelLibrary  # noqa: E402
from fact.tune.inputs import gemm_args, make_inputs  # noqa: E402
from fact.tune.reference import gemm_spec  # noqa: E402

REPS = 200
BACKLOG_CYCLES = 2_000_000_000  # about a second at the H200's clocks


def host_us(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda._sleep(BACKLOG_CYCLES)
    times = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True)
    ap.add_argument("--pattern", type=int, required=True)
    ap.add_argument("--library", required=True)
    args = ap.parse_args()
    pattern = json.loads(Path(args.plan).read_text())["patterns"][args.pattern]
    lib = KernelLibrary(args.library)
    inputs = make_inputs(pattern, None, device="cuda", seed=1)
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    packed = gemm_args(inputs, {}, sm_count)
    nbytes = lib.workspace_size(packed)
    workspace = torch.empty(max(nbytes, 1), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    handle = ops.register_kernel(ops.GemmKernel(gemm_spec(pattern), "cutlass", lib, {}, lib.name))
    body = ops.BODIES[torch.ops.fact.gemm.default]
    A, B, operands = inputs.A, inputs.B, inputs.operands
    layers = {
        "can_implement": lambda: lib.can_implement(packed),
        "workspace_size": lambda: lib.workspace_size(packed),
        "run": lambda: lib.run(packed, workspace.data_ptr(), nbytes, stream),
        "gemm_args": lambda: gemm_args(inputs, {}, sm_count),
        "body": lambda: body(A, B, operands, handle),
        "torch.ops.fact.gemm": lambda: torch.ops.fact.gemm(A, B, operands, handle),
    }
    for fn in layers.values():  # warm up, and fail here if a layer cannot run
        fn()
    torch.cuda.synchronize()
    same = torch.equal(body(A, B, operands, handle), torch.ops.fact.gemm(A, B, operands, handle))
    print(f"kernel {lib.name}, pattern {args.pattern} {pattern.get('signature')}")
    gpu = torch.cuda.get_device_name()
    print(f"problem {pattern.get('problem')}; torch {torch.__version__}; {gpu}")
    print(f"body and op agree bit for bit: {same}")
    print("| layer | host us per call (median of 200) |")
    print("| --- | --- |")
    for name, fn in layers.items():
        print(f"| {name} | {host_us(fn):.1f} |")


if __name__ == "__main__":
    main()
