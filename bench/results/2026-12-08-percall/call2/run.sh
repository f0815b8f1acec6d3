#!/usr/bin/env bash
# The held-out GEMM modules no call has reached yet, pointwise_three_inputs, and gemm_scale_leaky
# again (after the per-call trims: does the guard keep FACT's module now?), through fact bench
# (bench/heldout.py, T seconds). Best right after call 1 on the same machine, whose kernel cache
# it then finds full; on a fresh machine the prewarm compiles them again first.
set -uo pipefail
source scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
fact_device_seed
H=bench/heldout
LIST=${PROBLEMS:-"gemm_sigmoid_gate gemm_silu_div_clamp_tanh gemm_elu_scale gemm_residual_relu
  gemm_nobias_hardswish gemm_scale_hardtanh_gelu gemm_softplus_tanh_down
  gemm_add_silu_tanh_gelu_hardtanh pointwise_three_inputs gemm_scale_leaky"}
FILES=(); for p in $LIST; do [ -f "$p" ] && FILES+=("$p") || FILES+=("$H/$p.py"); done
PREWARM_S=${PREWARM_S:-240}
time fact_device_prewarm bf16 high "${FILES[@]}"
timeout "${T:-300}" python3 bench/heldout.py --out "$OUT/heldout" --runs "$RUNS/heldout" --bandwidth \
  "${FILES[@]}" > "$OUT/heldout.log" 2>&1
echo "heldout rc=$?"; grep -E "^== |Error|error:|compiling" "$OUT/heldout.log" | cut -c1-160 | tail -24
cat "$OUT/heldout/heldout.md" 2>/dev/null; grep "TB/s" "$OUT/heldout.log"
