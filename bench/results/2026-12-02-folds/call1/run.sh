#!/usr/bin/env bash
# Session 19 (planned in 18), device call 1: the LayerNorm folds on the GPU. Their GPU test,
# then MiniGPT bf16 and fp32 `highest` with folds and without (cold kernel cache: ABI 6).
set -uo pipefail
source scripts/device_env.sh
t0=$(date +%s)
timeout 200 scripts/gpu_tests.sh tests/python/test_compose_gpu.py -k "folded or weights_updated or cuda_graph" > $OUT/gpu_tests_folds.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/gpu_tests_folds.log | cut -c1-160 | tail -8
t1=$(date +%s)
timeout $(( 570 - (t1 - t0) )) scripts/gpu_bench.sh minigpt-bf16 minigpt-bf16-nofold > $OUT/bench.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t1 )) s"
for job in minigpt-bf16 minigpt-bf16-nofold; do
  echo "== $job"; sed -n '/| module/,/^$/p' $OUT/$job/report.md 2>/dev/null | head -7 | cut -d'|' -f2-7
  grep -E "folded|dropped" $OUT/$job/report.md 2>/dev/null | cut -c1-300
done
