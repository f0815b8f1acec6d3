#!/usr/bin/env bash
# Session 15, device call 4: the attention GPU tests (with the new
# test_attention_v_with_its_keys_contiguous) on kernels realized on the CPU machine at this
# revision: FACT_REGISTRY=(empty) and each command `python tests/python/test_tune_gpu.py
# .device/atr` prints, run there (FACT_TEST_ATTENTION_RUNS).
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/empty.db PYTHON=python3 PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 \
  FACT_TEST_ATTENTION_RUNS=$PWD/.device/atr
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
t0=$(date +%s)
timeout 500 scripts/gpu_tests.sh -k "attention" > $OUT/gpu_tests_attention.log 2>&1; echo "attention tests rc=$? $(( $(date +%s) - t0 )) s"
grep -E "PASSED|FAILED|ERROR|passed|failed|SKIPPED" $OUT/gpu_tests_attention.log | tail -45 | cut -c1-220
