#!/usr/bin/env bash
# ViT-B/16 block with fact.layouts' MHA rewrites: the bench (eager, torch.compile, FACT), then
# its kernels one by one (bench/vit_kernels.py --fact, warm cache).
set -uo pipefail
source scripts/device_env.sh
[ -f "$FACT_REGISTRY" ] || "$FACT_ENGINE" registry import data/registry_seed.json > /dev/null
timeout 330 scripts/gpu_bench.sh vit-bf16 > "$OUT/vit.log" 2>&1
echo "vit rc=$?"; grep -E "^\| [0-9]|^module|^eager|^torch|^fact|wall|runs the|check before" "$OUT/vit.log" "$OUT"/vit-bf16/report.md 2>/dev/null | cut -c1-260 | tail -24
timeout 200 python3 bench/vit_kernels.py --fact > "$OUT/vit_kernels.log" 2>&1
echo "vit_kernels rc=$?"; grep -v Warning "$OUT/vit_kernels.log" | grep -v "^\[" | cut -c1-150 | tail -60
timeout 150 scripts/gpu_tests.sh tests/python/test_compose_gpu.py -k multihead -q > "$OUT/gpu_test.log" 2>&1
echo "gpu test rc=$?"; tail -4 "$OUT/gpu_test.log" | cut -c1-200
