#!/usr/bin/env bash
# Session 12, device call 1: horizontal GEMMs as CUTLASS grouped kernels. The GPU tests of the
# new kernel (tuner: every candidate verified incl. ragged shapes; composed: one grouped call,
# in-place weight updates, CUDA graph replay), then the Llama-3 block in bf16 (cold kernel
# cache, seeded registry).
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/registry.db RUNS=$PWD/.gpu/runs PYTHON=python3 PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
timeout 200 scripts/gpu_tests.sh -k "horizontal" > $OUT/gpu_tests_horizontal.log 2>&1; echo "horizontal tests rc=$? $(( $(date +%s) - t0 )) s"
tail -n 6 $OUT/gpu_tests_horizontal.log
for job in ${JOBS:-llama-bf16}; do
  timeout ${JOB_TIMEOUT:-300} scripts/gpu_bench.sh $job > $OUT/$job.out 2>&1; echo "$job rc=$? $(( $(date +%s) - t0 )) s"
  sed -n '/| module/,/^$/p' $OUT/$job/report.md 2>/dev/null | head -7 | cut -d'|' -f2-6
  grep -E "^\| [0-9]" $OUT/$job/report.md | cut -d'|' -f2-7 | cut -c1-220
done
