#!/usr/bin/env bash
# Device call 3 (twenty-fourth session): the folded-heads attention fix on the GPU (GPU test and
# the clip zoo block again), and MiniGPT bf16 with the clock reasons recorded.
set -uo pipefail
source scripts/device_env.sh
timeout 150 python3 -m pytest -p no:cacheprovider -q -m gpu tests/python/test_compose_gpu.py \
  -k "clip_folded" > "$OUT/gpu_tests_clip.log" 2>&1
scripts/gpu_bench.sh clip-bf16 > "$OUT/bench_clip.log" 2>&1
timeout 220 scripts/gpu_bench.sh minigpt-bf16 > "$OUT/bench_minigpt.log" 2>&1
tail -3 "$OUT/gpu_tests_clip.log"
for j in clip-bf16 minigpt-bf16; do sed -n '/^| module/,/^$/p;/^FACT replaced/p' "$OUT/$j/report.md"; done
grep -E "^\| 1 " "$OUT/clip-bf16/report.md" | cut -c1-300
