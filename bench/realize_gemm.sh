#!/usr/bin/env bash
# Stage 2 on the CPU machine, for the GEMM benchmarks of shared/BENCHMARKS.md: plan each problem,
# emit and compile its candidate kernels into run directories under $1 (default .device/bench),
# ready to be carried to the GPU machine and tuned there by bench/gemm_bench.py.
#
# SETS (default "bf16 tf32") picks the sets: bf16 and tf32 (fp32 with TF32 allowed) are the
# benchmarks of shared/BENCHMARKS.md; fp32 is fp32 under "highest" (3xTF32 kernels): the square
# and batched GEMMs, the epilogue zoo and two GEMMs whose tails read a column vector and a
# scalar, or sit under one wave of tiles.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.device/bench}
candidates=${CANDIDATES:-6}
mkdir -p "$out"
for set in ${SETS:-bf16 tf32}; do
  case $set in
    bf16)
      for problem in gemm_bias_gelu gemm_square gemm_batched gemm_large_k; do
        .venv/bin/fact realize "bench/problems/$problem.py" --dtype bf16 --candidates "$candidates" \
          --out "$out/${problem}_bf16"
      done ;;
    tf32)  # B K-major (a @ w.t()): TF32 WGMMAs take no other layout, so FACT refuses a row-major B
      for problem in gemm_square_tn gemm_batched_tn gemm_large_k_tn; do
        .venv/bin/fact realize "bench/problems/$problem.py" --dtype fp32 --precision high \
          --candidates "$candidates" --out "$out/${problem}_tf32"
      done ;;
    fp32)
      for problem in gemm_square gemm_batched epilogue_zoo gemm_col_scalar gemm_sigmoid_residual; do
        .venv/bin/fact realize "bench/problems/$problem.py" --dtype fp32 --precision highest \
          --candidates "$candidates" --out "$out/${problem}_fp32"
      done ;;
    *) echo "unknown set $set (bf16, tf32, fp32)" >&2; exit 2 ;;
  esac
done
