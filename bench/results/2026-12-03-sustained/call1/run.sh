#!/usr/bin/env bash
# Device call 1 (twenty-sixth session): do the MiniGPT block's GEMM candidates rank the same
# timed in bursts (the tuner) and back to back under the power cap (the block)?
set -uo pipefail
source scripts/device_env.sh
[ -f "$FACT_REGISTRY" ] || "$FACT_ENGINE" registry import data/registry_seed.json > /dev/null
timeout 200 python3 -m fact realize examples/minigpt_block.py --dtype bf16 --candidates 5 \
  --out "$RUNS/mg" > "$OUT/realize.log" 2>&1
tail -2 "$OUT/realize.log"
timeout 300 python3 bench/sustained.py "$RUNS/mg" --out "$OUT/sustained" --seconds 0.6 --rest 0.3 \
  > "$OUT/sustained.log" 2>&1
tail -45 "$OUT/sustained.log" | cut -c1-200
