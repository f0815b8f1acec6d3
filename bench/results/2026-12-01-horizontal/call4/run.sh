#!/usr/bin/env bash
# Session 12, device call 4, at the revision with the heaviest-first causal tile order and the
# re-measured seed rows: the attention GPU tests (every realized kernel verified: causal head dim
# 96, grouped-query, multi-query, ragged 500, a scale of its own), then the MiniGPT and Llama
# blocks in bf16 (cold kernel cache, seeded registry).
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/registry.db RUNS=$PWD/.gpu/runs PYTHON=python3 PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
timeout 240 scripts/gpu_tests.sh -k "realized_attention" > $OUT/gpu_tests_attention.log 2>&1; echo "attention tests rc=$? $(( $(date +%s) - t0 )) s"
tail -n 4 $OUT/gpu_tests_attention.log
for job in ${JOBS:-minigpt-bf16 llama-bf16}; do
  timeout ${JOB_TIMEOUT:-240} scripts/gpu_bench.sh $job > $OUT/$job.out 2>&1; echo "$job rc=$? $(( $(date +%s) - t0 )) s"
  sed -n '/| module/,/^$/p' $OUT/$job/report.md 2>/dev/null | head -7 | cut -d'|' -f2-6
  grep -E "^\| [0-9]" $OUT/$job/report.md | cut -d'|' -f2-7 | cut -c1-200
done
