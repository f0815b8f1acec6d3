#!/usr/bin/env bash
# Session 17, device call 2: GPU tests. (1) The manifest tests on the square GEMMs' kernels of
# call 1 (bf16, and TF32 under "high"): each kernel verified and timed over every launch knob,
# and each stream-K kernel checked under every reduction x decomposition (bits repeat for the
# ordered reduction; split-K with a forced decomposition refused). (2) The composed-attention
# tests (the sixteenth session's review follow-ups, not yet run on the GPU).
set -u
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/registry.db PYTHON=python3 PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
t0=$(date +%s)
FACT_TEST_KERNELS=.device/sk/gemm_square_bf16 timeout 150 scripts/gpu_tests.sh tests/python/test_tune_gpu.py -k manifest -s > $OUT/manifest_bf16.log 2>&1; echo "manifest bf16 rc=$? $(( $(date +%s) - t0 )) s"
FACT_TEST_KERNELS=.device/sk/gemm_square_tn_tf32 FACT_TEST_PRECISION=high timeout 150 scripts/gpu_tests.sh tests/python/test_tune_gpu.py -k manifest -s > $OUT/manifest_tf32.log 2>&1; echo "manifest tf32 rc=$? $(( $(date +%s) - t0 )) s"
timeout 330 scripts/gpu_tests.sh tests/python/test_compose_gpu.py -k attention > $OUT/compose_attention.log 2>&1; echo "compose attention rc=$? $(( $(date +%s) - t0 )) s"
grep -hE "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $OUT/*.log | cut -c1-160 | tail -30
