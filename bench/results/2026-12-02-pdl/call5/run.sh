#!/usr/bin/env bash
# Session 20, device call 5: a second sample of call 3's MiniGPT bf16 A/B (--compare-pdl; cold
# kernel cache, seeded registry), in a fresh process on a fresh machine.
set -uo pipefail
source scripts/device_env.sh
t0=$(date +%s)
BENCH_FLAGS=--compare-pdl timeout 280 scripts/gpu_bench.sh minigpt-bf16 > $OUT/bench_minigpt.log 2>&1
echo "minigpt rc=$? $(( $(date +%s) - t0 )) s"
echo "== minigpt-bf16"; sed -n '/| module/,/^$/p' $OUT/minigpt-bf16/report.md 2>/dev/null | head -9 | cut -d'|' -f2-7,8
