#!/usr/bin/env bash
# The held-out GEMM modules no call has reached yet, pointwise_three_inputs, and gemm_scale_leaky
# again (after the per-call trims: does the guard keep FACT's module now?), through fact bench
# (bench/heldout.py, T seconds). Best right after call 1 on the same machine, whose kernel cache
# it then finds full; on a fresh machine the prewarm compiles them again first.
set -uo pipefail
source scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
fact_device_seed
source bench/results/2026-12-08-percall/problems.sh
PREWARM_S=${PREWARM_S:-240}
time fact_device_prewarm bf16 high "${FILES[@]}"
timeout "${T:-300}" python3 bench/heldout.py --out "$OUT/heldout" --runs "$RUNS/heldout" --bandwidth \
  "${FILES[@]}" > "$OUT/heldout.log" 2>&1
echo "heldout rc=$?"; grep -E "^== |Error|error:|compiling" "$OUT/heldout.log" | cut -c1-160 | tail -24
cat "$OUT/heldout/heldout.md" 2>/dev/null; grep "TB/s" "$OUT/heldout.log"
