#!/usr/bin/env bash
# Device call 1 (twenty-fourth session): the new zoo blocks gemma and qwen2, bf16, through
# scripts/gpu_bench.sh (fact bench: eager vs torch.compile vs FACT in one process). Cold caches.
set -uo pipefail
source scripts/device_env.sh
nvidia-smi -q -d PERFORMANCE > "$OUT/perf_idle.txt" 2>&1
scripts/gpu_bench.sh gemma-bf16 qwen2-bf16 > "$OUT/bench.log" 2>&1
nvidia-smi -q -d PERFORMANCE > "$OUT/perf_after.txt" 2>&1
for j in gemma-bf16 qwen2-bf16; do sed -n '/^| module/,/^$/p;/^FACT replaced/p' "$OUT/$j/report.md"; done
