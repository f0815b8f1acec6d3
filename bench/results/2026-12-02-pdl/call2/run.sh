#!/usr/bin/env bash
# Session 20, device call 2: why the LayerNorm kernel ran 83 us in context with PDL (53 before).
# bench/norm_bench.py --pdl on the MiniGPT LayerNorm kernels realized on the CPU machine
# (.device/norm/ln: `fact realize` of nn.LayerNorm(768) on 128x512 rows, bf16, --candidates 3)
# and on three hand-edited copies of the t32 kernel's source, built with the engine's nvcc flags:
# nowait (neither griddepcontrol instruction), waitonly (no launch_dependents), trigonly (no wait).
set -uo pipefail
source scripts/device_env.sh
for v in ln nowait waitonly trigonly; do
  echo "== $v"; timeout 100 python3 bench/norm_bench.py .device/norm/$v --pdl --reps 30 > $OUT/norm_$v.md 2>&1
  sed -n '/Plain and/,$p' $OUT/norm_$v.md | grep "^| fact"
done
