#!/usr/bin/env bash
# After the per-launch fix of the sm90 templates (no driver lookup per TMA descriptor, CUTLASS's
# initialize() once per device): (1) the driver calls CUTLASS makes per launch, timed alone
# (bench/percall_driver.cu); (2) each layer of the GEMM module's call path under the engine
# before the fix (fact-engine-old, kernels from before) and after it (bench/percall_probe.py);
# (3) the held-out suite through fact bench, the five GEMM modules of call 1 first, then the
# modules call 1 did not reach, while time lasts (T seconds); (4) with SWEEP set, one optimize
# of the MiniGPT block served at four sequence lengths (bench/size_sweep.py, without
# torch.compile for time).
set -uo pipefail
source scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
nvcc -O2 -arch=sm_90a bench/percall_driver.cu -lcuda -o /tmp/percall_driver && /tmp/percall_driver | tee "$OUT/driver.txt"
fact_device_seed
H=bench/heldout
FACT_ENGINE=$PWD/.device/bin/fact-engine-old timeout 90 python3 bench/percall_probe.py \
  --out "$OUT/probe_old" $H/gemm_scale_leaky.py > "$OUT/probe_old.log" 2>&1
echo "probe (before) rc=$?"
timeout 100 python3 bench/percall_probe.py --out "$OUT/probe" $H/gemm_scale_leaky.py \
  $H/pointwise_bias_swish.py > "$OUT/probe.log" 2>&1
echo "probe (after) rc=$?"
LIST=${PROBLEMS:-"gemm_scale_leaky gemm_sub_mul_relu gemm_gelu_tanh_up gemm_mish_mish gemm_selu
  qwen2_stack pointwise_three_inputs gemm_sigmoid_gate gemm_silu_div_clamp_tanh gemm_elu_scale
  gemm_residual_relu gemm_nobias_hardswish gemm_scale_hardtanh_gelu gemm_softplus_tanh_down
  gemm_add_silu_tanh_gelu_hardtanh"}
FILES=(); for p in $LIST; do FILES+=("$H/$p.py"); done
timeout "${T:-150}" python3 bench/heldout.py --out "$OUT/heldout" --runs "$RUNS/heldout" --bandwidth \
  "${FILES[@]}" > "$OUT/heldout.log" 2>&1
echo "heldout rc=$?"; grep -E "^== |Error|error:" "$OUT/heldout.log" | cut -c1-160 | tail -20
[ -n "${SWEEP:-}" ] && timeout 90 python3 bench/size_sweep.py examples/minigpt_block.py --sizes 128,256,384,512 \
  --no-compile --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"; tail -9 "$OUT/sweep.log"
grep -A12 "^problem " "$OUT/probe_old.log"; grep -A12 "^problem " "$OUT/probe.log"
cat "$OUT/heldout/heldout.md" 2>/dev/null; grep "TB/s" "$OUT/heldout.log"
