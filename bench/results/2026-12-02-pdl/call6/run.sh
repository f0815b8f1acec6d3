#!/usr/bin/env bash
# Session 20, device call 6: at the final revision (scalar-operand GEMMs launch plainly), the
# composed-module GPU tests that run other kernel kinds next to dependent launches: fp32
# `highest` (sm80 3xTF32 kernels), torch.compile, warm optimize, in-place weights.
set -uo pipefail
source scripts/device_env.sh
t0=$(date +%s)
timeout 200 scripts/gpu_tests.sh tests/python/test_compose_gpu.py -k "replace_the_patterns or weights_updated or torch_compile or warm_optimize or fp32_highest" > $OUT/gpu_tests_compose.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|Error" $OUT/gpu_tests_compose.log | cut -c1-200 | tail -12
