#!/usr/bin/env bash
# Device call 4 (twenty-fourth session): every GPU attention test (the five attention blocks,
# through the generated FMHA kernels), after this session's changes to how Q and K are read.
set -uo pipefail
source scripts/device_env.sh
timeout 520 python3 -m pytest -p no:cacheprovider -q -m gpu tests/python/test_compose_gpu.py \
  -k "generated_attention or fact_attention_op" > "$OUT/gpu_tests_attention.log" 2>&1
tail -5 "$OUT/gpu_tests_attention.log"
