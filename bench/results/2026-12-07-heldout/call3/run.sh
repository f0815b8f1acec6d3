#!/usr/bin/env bash
# The GPU tests of the features added without a GPU (2026-12-07): the in-place tail and the
# agent's lowerings as generated epilogues, a saved module loaded in a new process with an
# empty kernel cache; then the rest of test_compose_gpu.py while time lasts. pytest -s prints
# the first-call latency of the loaded module and the lowered pattern's timings.
set -uo pipefail
source scripts/device_env.sh
fact_device_seed
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout "${T:-540}" scripts/gpu_tests.sh tests/python/test_compose_gpu.py -s -k \
  "in_place_tail or agent_lowerings or saved_module or generated_kernels_replace" \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "passed|failed|PASSED|FAILED|first call|chosen" "$OUT/gpu_tests.log" | tail -20
