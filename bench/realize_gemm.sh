#!/usr/bin/env bash
# Stage 2 on the CPU machine, for the GEMM benchmarks of shared/BENCHMARKS.md: plan each problem,
# emit and compile its candidate kernels into run directories under $1 (default .device/bench),
# ready to be carried to the GPU machine and tuned there by bench/gemm_bench.py.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.device/bench}
candidates=${CANDIDATES:-6}
mkdir -p "$out"
for problem in gemm_bias_gelu gemm_square gemm_batched gemm_large_k; do
  .venv/bin/fact realize "bench/problems/$problem.py" --dtype bf16 --candidates "$candidates" \
    --out "$out/${problem}_bf16"
done
for problem in gemm_square gemm_batched gemm_large_k; do
  .venv/bin/fact realize "bench/problems/$problem.py" --dtype fp32 --precision high \
    --candidates "$candidates" --out "$out/${problem}_tf32"
done
