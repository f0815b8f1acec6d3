#!/usr/bin/env bash
# Device call 2 (twenty-fourth session): the GPU's power limits; the GPU attention tests of
# Whisper's scaled attention; the zoo block clip; the Llama block with the clock reasons recorded.
set -uo pipefail
source scripts/device_env.sh
nvidia-smi -q -d POWER > "$OUT/power.txt" 2>&1
timeout 150 python3 -m pytest -p no:cacheprovider -q -m gpu tests/python/test_compose_gpu.py \
  -k whisper > "$OUT/gpu_tests_whisper.log" 2>&1
scripts/gpu_bench.sh clip-bf16 > "$OUT/bench_clip.log" 2>&1
timeout 230 scripts/gpu_bench.sh llama-bf16 > "$OUT/bench_llama.log" 2>&1
nvidia-smi -q -d PERFORMANCE > "$OUT/perf_after.txt" 2>&1
grep -E "Power Limit|Power Draw" "$OUT/power.txt" | head -12
tail -3 "$OUT/gpu_tests_whisper.log"
for j in clip-bf16 llama-bf16; do sed -n '/^| module/,/^$/p;/^FACT replaced/p' "$OUT/$j/report.md"; done
