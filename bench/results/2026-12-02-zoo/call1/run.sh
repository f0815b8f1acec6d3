#!/usr/bin/env bash
# Call 1: the four zoo blocks as FACT planned them at the session's start (638144e + the zoo
# files), bf16, cold kernel cache, seeded registry: fact bench each (eager, torch.compile, FACT).
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
timeout 540 scripts/gpu_bench.sh vit-bf16 neox-bf16 bert-bf16 t5-bf16 > "$OUT/bench.log" 2>&1 || echo "gpu_bench: rc $?" >> "$OUT/bench.log"
grep -h -A8 "^| module" "$OUT"/*/report.md | grep -v "^--" > "$OUT/summary.txt"
grep -h "replaced\|End-to-end" "$OUT"/*/report.md >> "$OUT/summary.txt"
cat "$OUT/summary.txt"; tail -5 "$OUT/bench.log"
