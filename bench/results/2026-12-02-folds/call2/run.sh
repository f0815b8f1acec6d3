#!/usr/bin/env bash
# Session 19, device call 2: PyTorch's SDPA backends at the MiniGPT and Llama attention shapes.
set -uo pipefail
source scripts/device_env.sh
python3 bench/sdpa_backends.py --out $OUT/sdpa 2>&1 | tee $OUT/sdpa_backends.log | tail -12
