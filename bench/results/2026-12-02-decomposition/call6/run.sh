#!/usr/bin/env bash
# Session 17, device call 6: with ABI 5 and this session's ranking, scripts/gpu_bench.sh
# minigpt-bf16 (cold kernel cache, seeded registry, eager and torch.compile in the same run);
# then the composed-module GPU tests other than attention (GEMMs through fact::gemm with ABI 5).
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/registry.db PYTHON=python3 PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r RUNS=$PWD/.gpu/runs
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
timeout 280 scripts/gpu_bench.sh minigpt-bf16 > $OUT/bench.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t0 )) s"
grep -E "end-to-end|done:" $OUT/minigpt-bf16.log | cut -c1-240
sed -n '/| module/,/^$/p' $OUT/minigpt-bf16/report.md 2>/dev/null | head -7 | cut -d'|' -f2-8
grep -E "^\| [0-9]" $OUT/minigpt-bf16/report.md 2>/dev/null | cut -d'|' -f2-7 | cut -c1-200
t1=$(date +%s)
timeout $(( 560 - (t1 - t0) )) scripts/gpu_tests.sh tests/python/test_compose_gpu.py -k "not attention" > $OUT/gpu_tests_compose.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t1 )) s"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/gpu_tests_compose.log | cut -c1-160 | tail -16
