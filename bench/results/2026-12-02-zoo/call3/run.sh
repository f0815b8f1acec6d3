#!/usr/bin/env bash
# Call 3: BERT again after fresh_inputs learnt to shuffle a 0/1 float mask (call 2's end-to-end
# check had randomized it into a huge positive bias, and the attention fell back), then the
# MiniGPT block, the regression check of the main benchmark with this session's changes (the
# guard must keep FACT's module there). bf16, cold kernel cache, seeded registry.
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
timeout 430 scripts/gpu_bench.sh bert-bf16 minigpt-bf16 > "$OUT/bench.log" 2>&1 || echo "gpu_bench: rc $?" >> "$OUT/bench.log"
for f in "$OUT"/*/report.md; do
  echo "== $f"; grep -A7 "^| module" "$f" | tail -n +3; grep "replaced\|End-to-end\|original model" "$f"
done > "$OUT/summary.txt"
cat "$OUT/summary.txt"; tail -3 "$OUT/bench.log"
