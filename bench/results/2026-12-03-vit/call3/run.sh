#!/usr/bin/env bash
# The MHA GPU test after the review's fixes (cold cache: its kernels compile here).
set -uo pipefail
source scripts/device_env.sh
timeout 140 scripts/gpu_tests.sh tests/python/test_compose_gpu.py -k multihead -q > "$OUT/gpu_test.log" 2>&1
echo "gpu test rc=$?"; grep -E "passed|failed|Error|^E " "$OUT/gpu_test.log" | head -12 | cut -c1-220
