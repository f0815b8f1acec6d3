#!/usr/bin/env bash
# Session 13, device call 4, at the final revision: the MiniGPT block in bf16 (cold kernel cache,
# seeded registry): the attention pattern's candidates now lead with the overlapped mainloop and
# the second Q, checked in the composed module against SDPA.
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/registry.db RUNS=$PWD/.gpu/runs PYTHON=python3 PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
for job in minigpt-bf16; do
  timeout 480 scripts/gpu_bench.sh $job > $OUT/$job.out 2>&1; echo "$job rc=$? $(( $(date +%s) - t0 )) s"
  sed -n '/| module/,/^$/p' $OUT/$job/report.md 2>/dev/null | head -7 | cut -d'|' -f2-6
  grep -E "^\| [0-9]" $OUT/$job/report.md | cut -d'|' -f2-7 | cut -c1-250
done
