#!/usr/bin/env bash
# Held-out workloads, first batch (issue 31): the GEMM + tail modules of the table, the
# written-out GELU and a wide RMSNorm, through fact bench (eager, torch.compile, FACT; per call
# and back to back; host time). Kernels for them were compiled on the CPU machine
# (.device/kcache.tar.xz); the tails' pointwise kernels compile here.
set -uo pipefail
source scripts/device_env.sh
mkdir -p "$FACT_CACHE_DIR" && tar xJf .device/kcache.tar.xz -C "$FACT_CACHE_DIR"
[ -f "$FACT_REGISTRY" ] || "$FACT_ENGINE" registry import data/registry_seed.json > /dev/null
nvcc --version | tail -1; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
H=bench/heldout
timeout 560 python3 bench/heldout.py --out "$OUT/heldout" --runs "$RUNS/heldout" --bandwidth \
  $H/gemm_scale_leaky.py $H/gemm_sub_mul_relu.py $H/gemm_mish_mish.py $H/pointwise_gelu_written.py \
  $H/gemm_silu_div_clamp_tanh.py $H/norm_rms_wide.py $H/gemm_gelu_tanh_up.py \
  $H/gemm_scale_hardtanh_gelu.py $H/gemm_add_silu_tanh_gelu_hardtanh.py > "$OUT/heldout.log" 2>&1
echo "heldout rc=$?"; grep -E "^== |Error|error:" "$OUT/heldout.log" | cut -c1-200 | tail -30
cat "$OUT/heldout/heldout.md" 2>/dev/null; grep "TB/s" "$OUT/heldout.log"
