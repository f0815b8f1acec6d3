#!/usr/bin/env bash
# Session 16, device call 2: the composed attention GPU tests (bf16 MiniGPT-like, GQA through
# SDPA, fp32/TF32 where fact.layouts writes V^T and the TF32 FMHA reads it in place), by name;
# then scripts/gpu_bench.sh minigpt-bf16 (cold kernel cache, seeded registry, eager and
# torch.compile in the same run).
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/registry.db PYTHON=python3 PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r RUNS=$PWD/.gpu/runs
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
timeout 300 scripts/gpu_tests.sh tests/python/test_compose_gpu.py -k attention -v > $OUT/gpu_tests_compose_attention.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/gpu_tests_compose_attention.log | grep -v "^tests/" | cut -c1-200 | tail -12
t1=$(date +%s)
timeout $(( 570 - (t1 - t0) )) scripts/gpu_bench.sh minigpt-bf16 > $OUT/bench.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t1 )) s"
grep -E "end-to-end|done:" $OUT/minigpt-bf16.log | cut -c1-240
sed -n '/| module/,/^$/p' $OUT/minigpt-bf16/report.md 2>/dev/null | head -7 | cut -d'|' -f2-8
grep -E "^\| [0-9]" $OUT/minigpt-bf16/report.md 2>/dev/null | cut -d'|' -f2-7 | cut -c1-200
