#!/usr/bin/env bash
# Held-out workloads (issue 31) and the MiniGPT block through fact bench (eager, torch.compile,
# FACT; per call and back to back; host time), most telling first: GEMM + tail modules of the
# issue's table, the written-out GELU, a wide RMSNorm, MiniGPT, two Llama-3-8B layers from
# transformers, then the rest while time lasts. Kernels were compiled on the CPU machine
# (.device/kcache.tar.xz, keys independent of paths).
set -uo pipefail
source scripts/device_env.sh
fact_device_seed
nvcc --version | tail -1; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
H=bench/heldout
# PROBLEMS (names under bench/heldout/, or paths) narrows the list for a short lease.
LIST=${PROBLEMS:-"gemm_scale_leaky pointwise_gelu_written llama_stack gemm_sub_mul_relu
  examples/minigpt_block.py norm_rms_wide gemm_mish_mish gemm_gelu_tanh_up gemm_selu
  pointwise_bias_swish"}
FILES=(); for p in $LIST; do [ -f "$p" ] && FILES+=("$p") || FILES+=("$H/$p.py"); done
timeout "${T:-565}" python3 bench/heldout.py --out "$OUT/heldout" --runs "$RUNS/heldout" --bandwidth \
  "${FILES[@]}" > "$OUT/heldout.log" 2>&1
echo "heldout rc=$?"; grep -E "^== |Error|error:|compiling" "$OUT/heldout.log" | cut -c1-160 | tail -24
cat "$OUT/heldout/heldout.md" 2>/dev/null; grep "TB/s" "$OUT/heldout.log"
