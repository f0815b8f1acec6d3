#!/usr/bin/env bash
# Device call 5 (twenty-sixth session): the guard's timing of ViT's original module.
set -uo pipefail
source scripts/device_env.sh
[ -f "$FACT_REGISTRY" ] || "$FACT_ENGINE" registry import data/registry_seed.json > /dev/null
timeout 230 python3 bench/guard_check.py > "$OUT/guard_check.log" 2>&1
echo "rc=$?"; grep -v Warning "$OUT/guard_check.log" | tail -16 | cut -c1-200
