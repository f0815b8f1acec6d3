#!/usr/bin/env bash
# Issue 31 after the per-call host trims (forward's grad switch, the per-call graph called
# without nn.Module's call path, a cheaper signature, the device check of prepared launches, the
# bench's host time read in runs behind one GPU spin): (0) the kernels of call 1 and call 2's
# problems compiled first, on the GPU machine's 16 cores (scripts/device_env.sh:
# fact_device_prewarm, at most PREWARM_S seconds); (1) each layer of the call path of
# gemm_scale_leaky and pointwise_bias_swish (bench/percall_probe.py; call 4 of 2026-12-07 has
# the same table before the trims). Call 2 benches the held-out modules.
set -uo pipefail
source scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
fact_device_seed
source bench/results/2026-12-08-percall/problems.sh
PREWARM_S=${PREWARM_S:-330}
time fact_device_prewarm bf16 high "${FILES[@]}" $H/pointwise_bias_swish.py
timeout 150 python3 bench/percall_probe.py --out "$OUT/probe" $H/gemm_scale_leaky.py \
  $H/pointwise_bias_swish.py > "$OUT/probe.log" 2>&1
echo "probe rc=$?"
grep -A12 "^problem " "$OUT/probe.log"
