#!/usr/bin/env bash
# Device call 3 (twenty-sixth session): the stream-K kernels that build again, through the GPU
# manifest tests (every kernel verified and timed over its knobs, each stream-K kernel under
# every reduction x decomposition); cuBLAS's own kernel choice for the plain GEMMs; the MiniGPT
# block at this commit.
set -uo pipefail
source scripts/device_env.sh
t0=$(date +%s)
FACT_TEST_KERNELS=.device/bench/gemm_large_k_bf16 timeout 150 scripts/gpu_tests.sh \
  tests/python/test_tune_gpu.py -k manifest > "$OUT/manifest_large_k_bf16.log" 2>&1
echo "manifest large-K bf16 rc=$? $(( $(date +%s) - t0 )) s"
FACT_TEST_KERNELS=.device/bench/gemm_large_k_tn_tf32 FACT_TEST_PRECISION=high timeout 150 \
  scripts/gpu_tests.sh tests/python/test_tune_gpu.py -k manifest > "$OUT/manifest_large_k_tf32.log" 2>&1
echo "manifest large-K tf32 rc=$? $(( $(date +%s) - t0 )) s"
for d in bf16 tf32; do python3 bench/library_kernels.py --dtype $d; done > "$OUT/library_kernels.txt" 2>&1
timeout 230 scripts/gpu_bench.sh minigpt-bf16 > "$OUT/bench_minigpt.log" 2>&1
echo "minigpt rc=$? $(( $(date +%s) - t0 )) s"
grep -hE "passed|failed|error" "$OUT"/manifest_*.log | tail -4
cut -c1-200 "$OUT/library_kernels.txt"
sed -n '/^| module/,/^$/p;/^FACT replaced/p' "$OUT/minigpt-bf16/report.md"
