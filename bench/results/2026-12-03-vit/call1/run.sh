#!/usr/bin/env bash
# ViT-B/16 block kernel by kernel: eager's fused MHA path, the exported graph, FACT's composed
# module, and SDPA's backends on both memory orders of Q/K/V (bench/vit_kernels.py).
set -uo pipefail
source scripts/device_env.sh
[ -f "$FACT_REGISTRY" ] || "$FACT_ENGINE" registry import data/registry_seed.json > /dev/null
timeout 400 python3 bench/vit_kernels.py --fact > "$OUT/vit_kernels.log" 2>&1
echo "rc=$?"; grep -v Warning "$OUT/vit_kernels.log" | grep -v "^\[" | cut -c1-150 | tail -90
