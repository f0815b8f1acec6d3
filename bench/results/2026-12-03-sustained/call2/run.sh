#!/usr/bin/env bash
# Device call 2 (twenty-sixth session): issue 3's plain GEMMs and the fused GEMM + bias + GELU,
# burst (the tuner, every candidate verified) against sustained, cuBLAS in the same process.
# Kernels realized on the CPU machine: CANDIDATES=4 bench/realize_gemm.sh .device/bench
set -uo pipefail
source scripts/device_env.sh
timeout 520 python3 bench/sustained.py .device/bench/* --out "$OUT/sustained" --seconds 0.6 \
  --rest 0.3 > "$OUT/sustained.log" 2>&1
grep -E "^###|^\| (pytorch|fact)" "$OUT/sustained.log" | sed -E 's/fact_gemm_[a-z0-9]+_[a-z]+_[0-9a-f]+_//' | cut -c1-150
