#!/usr/bin/env bash
# Device call 5 (twenty-seventh session): the guard's timing of ViT's original module
# (bench/guard_check.py), then the ViT bench with the attention-tail fix (9e9ed7a), warm.
set -uo pipefail
source scripts/device_env.sh
[ -f "$FACT_REGISTRY" ] || "$FACT_ENGINE" registry import data/registry_seed.json > /dev/null
timeout 260 python3 bench/guard_check.py > "$OUT/guard_check.log" 2>&1
echo "guard_check rc=$?"; grep -v Warning "$OUT/guard_check.log" | tail -16 | cut -c1-200
timeout 280 scripts/gpu_bench.sh vit-bf16 > "$OUT/vit.log" 2>&1
echo "vit rc=$?"; grep -E "eager|compile|FACT|fact|pattern|wall" "$OUT/vit.log" | tail -16 | cut -c1-200
