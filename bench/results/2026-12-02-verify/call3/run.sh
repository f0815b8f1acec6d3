#!/usr/bin/env bash
# Session 23, device call 3: the blocks this session's rewrites opened (bf16, cold kernel
# cache, seeded registry; eager and torch.compile in the same run): bench/zoo/einsum_block.py
# (einsum projections and attention, GEGLU with its bias written out) and
# bench/zoo/phi3_block.py (fused gate_up_proj split into a gated MLP); then the MiniGPT block
# as a regression check of the composed module.
source scripts/device_env.sh
t0=$(date +%s)
for job in einsum-bf16:150 phi3-bf16:170 minigpt-bf16:200; do
  name=${job%:*} limit=${job#*:}
  left=$(( 515 - ($(date +%s) - t0) ))
  [ "$left" -lt 60 ] && { echo "$name: skipped, $left s left"; continue; }
  [ "$limit" -gt "$left" ] && limit=$left
  timeout "$limit" scripts/gpu_bench.sh "$name" > "$OUT/bench-$name.log" 2>&1 || echo "$name: rc $?"
  echo "$name: $(( $(date +%s) - t0 )) s"
done
for f in "$OUT"/*/report.md; do
  echo "== $f"; grep -A7 "^| module" "$f" | tail -n +3; grep "replaced\|End-to-end\|original model" "$f"
done > "$OUT/summary.txt"
cat "$OUT/summary.txt"
