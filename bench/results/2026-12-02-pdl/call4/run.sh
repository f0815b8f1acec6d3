#!/usr/bin/env bash
# Session 20, device call 4: the PDL GPU test on a module whose GEMM tails no cuBLASLt epilogue
# has (call 3's module picked cuBLASLt for both GEMMs, so its test could not run), then the
# MiniGPT block in fp32 with TF32 allowed, --compare-pdl (cold kernel cache, seeded registry).
set -uo pipefail
source scripts/device_env.sh
t0=$(date +%s)
timeout 150 scripts/gpu_tests.sh tests/python/test_compose_gpu.py -k "dependent_launches" > $OUT/gpu_tests_pdl.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|Error" $OUT/gpu_tests_pdl.log | cut -c1-200 | tail -8
t1=$(date +%s)
BENCH_FLAGS=--compare-pdl timeout $(( 400 - (t1 - t0) )) scripts/gpu_bench.sh minigpt-tf32 > $OUT/bench_minigpt_tf32.log 2>&1
echo "minigpt-tf32 rc=$? $(( $(date +%s) - t1 )) s"
echo "== minigpt-tf32"; sed -n '/| module/,/^$/p' $OUT/minigpt-tf32/report.md 2>/dev/null | head -9 | cut -d'|' -f2-7,8
