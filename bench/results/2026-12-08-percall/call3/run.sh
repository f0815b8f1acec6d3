#!/usr/bin/env bash
# Issue 31's host-time figure for the shipped blocks and the two decoder stacks call 1 of
# 2026-12-07 did not reach: (0) their kernels compiled first (fact_device_prewarm); (1) host time
# per call, FACT against eager, for the shipped blocks as optimize returns them
# (bench/percall_probe.py --graphs); (2) the Qwen2 and Mistral stacks through fact bench (T
# seconds); (3) with SWEEP set (and time left), one optimize of the MiniGPT block served at four
# sequence lengths (bench/size_sweep.py, issue 35).
set -uo pipefail
source scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
fact_device_seed
H=bench/heldout
PREWARM_S=${PREWARM_S:-240}
time fact_device_prewarm bf16 high examples/minigpt_block.py \
  examples/llama3_block.py $H/qwen2_stack.py $H/mistral_sliding.py
timeout 150 python3 bench/percall_probe.py --graphs --out "$OUT/probe_blocks" \
  examples/minigpt_block.py examples/llama3_block.py > "$OUT/probe_blocks.log" 2>&1
echo "probe rc=$?"
timeout "${T:-170}" python3 bench/heldout.py --out "$OUT/heldout" --runs "$RUNS/heldout" \
  $H/qwen2_stack.py $H/mistral_sliding.py > "$OUT/heldout.log" 2>&1
echo "heldout rc=$?"; grep -E "^== |Error|error:|compiling" "$OUT/heldout.log" | cut -c1-160 | tail -12
[ -n "${SWEEP:-}" ] && timeout 90 python3 bench/size_sweep.py examples/minigpt_block.py \
  --sizes 128,256,384,512 --no-compile --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"; tail -9 "$OUT/sweep.log" 2>/dev/null
grep -A12 "^problem " "$OUT/probe_blocks.log"
cat "$OUT/heldout/heldout.md" 2>/dev/null
