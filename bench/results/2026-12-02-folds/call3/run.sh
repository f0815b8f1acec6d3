#!/usr/bin/env bash
# Session 19, device call 3: the composed-module GPU tests the eighteenth session's changes touch
# (norm template's statistics mode, epilogue side computations, ABI 6, hoisted weights).
set -uo pipefail
source scripts/device_env.sh
t0=$(date +%s)
timeout 470 scripts/gpu_tests.sh tests/python/test_compose_gpu.py -k "norm_kernels or replace_the_patterns or fp32_highest or torch_compile or warm_optimize or horizontal or pointwise_zoo or rope" > $OUT/gpu_tests_compose.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/gpu_tests_compose.log | cut -c1-200 | tail -14
