#!/usr/bin/env bash
# Session 16, device call 1: the MiniGPT block in fp32 with TF32 allowed (precision high) at the
# revision where the fused QKV projection's V part writes V^T (fact.layouts) and the TF32 FMHA
# reads it in place: scripts/gpu_bench.sh minigpt-tf32 (cold kernel cache, seeded registry,
# eager and torch.compile in the same run); then the composed attention GPU tests (bf16, GQA
# SDPA, and fp32/TF32, where the V^T rewrite applies).
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/registry.db PYTHON=python3 PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r RUNS=$PWD/.gpu/runs
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
timeout 400 scripts/gpu_bench.sh minigpt-tf32 > $OUT/bench.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t0 )) s"
t1=$(date +%s)
timeout $(( 560 - (t1 - t0) )) scripts/gpu_tests.sh tests/python/test_compose_gpu.py -k "attention" > $OUT/gpu_tests_compose_attention.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s"; tail -12 $OUT/gpu_tests_compose_attention.log | cut -c1-200
grep -E "layout|end-to-end|done:" $OUT/minigpt-tf32.log | cut -c1-240
sed -n '/| module/,/^$/p' $OUT/minigpt-tf32/report.md 2>/dev/null | head -7 | cut -d'|' -f2-7
grep -E "^\| [0-9]" $OUT/minigpt-tf32/report.md 2>/dev/null | cut -d'|' -f2-7 | cut -c1-220
