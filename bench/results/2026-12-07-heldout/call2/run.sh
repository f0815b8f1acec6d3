#!/usr/bin/env bash
# Held-out transformers stack (Llama-3-8B sizes, 2 layers, 4 x 2048) and the MiniGPT block
# (bf16), then the warm check: MiniGPT optimized again as a deep copy and as a rebuilt model.
set -uo pipefail
source scripts/device_env.sh
fact_device_seed
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 330 python3 bench/heldout.py --out "$OUT/heldout" --runs "$RUNS/heldout" \
  bench/heldout/llama_stack.py examples/minigpt_block.py > "$OUT/heldout.log" 2>&1
echo "heldout rc=$?"; grep -E "^== |Error|error:" "$OUT/heldout.log" | cut -c1-200 | tail -20
cat "$OUT/heldout/heldout.md" 2>/dev/null
timeout 150 python3 bench/warm_check.py examples/minigpt_block.py > "$OUT/warm.log" 2>&1
echo "warm rc=$?"; tail -5 "$OUT/warm.log" | cut -c1-300
