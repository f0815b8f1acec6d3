#!/usr/bin/env bash
# Session 19, device call 4: the LayerNorm folds' A/B for fp32 `highest` (3xTF32 GEMMs).
set -uo pipefail
source scripts/device_env.sh
t1=$(date +%s)
timeout 400 scripts/gpu_bench.sh minigpt-fp32 minigpt-fp32-nofold > $OUT/bench.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t1 )) s"
for job in minigpt-fp32 minigpt-fp32-nofold; do
  echo "== $job"; sed -n '/| module/,/^$/p' $OUT/$job/report.md 2>/dev/null | head -7 | cut -d'|' -f2-7
  grep "^| [0-9]" $OUT/$job/report.md 2>/dev/null | cut -d'|' -f2,3,6,7 | cut -c1-110
done
