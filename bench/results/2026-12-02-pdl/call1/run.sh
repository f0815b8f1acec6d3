#!/usr/bin/env bash
# Session 20, device call 1: programmatic dependent launch (ABI 7). The MiniGPT block in bf16
# with --compare-pdl (FACT's modules with and without PDL in the same rounds; cold kernel
# cache, seeded registry), the PDL GPU test, then the Llama block likewise as time allows.
set -uo pipefail
source scripts/device_env.sh
t0=$(date +%s)
BENCH_FLAGS=--compare-pdl timeout 260 scripts/gpu_bench.sh minigpt-bf16 > $OUT/bench_minigpt.log 2>&1
echo "minigpt rc=$? $(( $(date +%s) - t0 )) s"
t1=$(date +%s)
timeout 150 scripts/gpu_tests.sh tests/python/test_compose_gpu.py -k "dependent_launches or cuda_graph_replay_and_plain" > $OUT/gpu_tests_pdl.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|Error" $OUT/gpu_tests_pdl.log | cut -c1-200 | tail -8
t2=$(date +%s)
BENCH_FLAGS=--compare-pdl timeout $(( 575 - (t2 - t0) )) scripts/gpu_bench.sh llama-bf16 > $OUT/bench_llama.log 2>&1
echo "llama rc=$? $(( $(date +%s) - t2 )) s"
for job in minigpt-bf16 llama-bf16; do
  echo "== $job"; sed -n '/| module/,/^$/p' $OUT/$job/report.md 2>/dev/null | head -9 | cut -d'|' -f2-7,8
done
