#!/usr/bin/env bash
# Call 2: the four zoo blocks again after this session's planner and composer changes (shrunk
# epilogues, one full operand per GEMM tail, T5 RMS norms, attention with an additive bias as SDPA,
# Q/K/V read after a copying contiguous, the guard against the original module), bf16, cold
# kernel cache, seeded registry: fact bench each (eager, torch.compile, FACT).
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
timeout 540 scripts/gpu_bench.sh t5-bf16 bert-bf16 vit-bf16 neox-bf16 > "$OUT/bench.log" 2>&1 || echo "gpu_bench: rc $?" >> "$OUT/bench.log"
for f in "$OUT"/*/report.md; do
  echo "== $f"; grep -A7 "^| module" "$f" | tail -n +3; grep "replaced\|End-to-end\|original model" "$f"
done > "$OUT/summary.txt"
cat "$OUT/summary.txt"; tail -3 "$OUT/bench.log"
