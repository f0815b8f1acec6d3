#!/usr/bin/env bash
# Call 4: the T5 layer at the session's final code (after the review follow-ups, 23ea8e9),
# the last of the device budget: bf16, cold kernel cache, seeded registry.
source scripts/device_env.sh
timeout 175 scripts/gpu_bench.sh t5-bf16 > "$OUT/bench.log" 2>&1 || echo "gpu_bench: rc $?" >> "$OUT/bench.log"
for f in "$OUT"/*/report.md; do
  echo "== $f"; grep -A7 "^| module" "$f" | tail -n +3; grep "replaced\|End-to-end\|original model" "$f"
done > "$OUT/summary.txt"
cat "$OUT/summary.txt"; tail -3 "$OUT/bench.log"
