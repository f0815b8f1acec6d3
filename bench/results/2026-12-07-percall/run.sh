#!/usr/bin/env bash
# Where the composed module's per-call time goes: the driver calls CUTLASS makes per launch
# (bench/percall_driver.cu), then each layer of the call path (bench/percall_probe.py), for the
# GEMM module built by the engine before (fact-engine-old: CUTLASS's initialize() per launch) and
# after (fact-engine) the sm90 templates stopped looking up the driver and setting the
# shared-memory attribute at every launch; then the memory-bound modules.
set -uo pipefail
source scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
nvcc -O2 -arch=sm_90a bench/percall_driver.cu -lcuda -o /tmp/percall_driver && /tmp/percall_driver | tee "$OUT/driver.txt"
fact_device_seed
H=bench/heldout
FACT_ENGINE=$PWD/.device/bin/fact-engine-old timeout 150 python3 bench/percall_probe.py \
  --out "$OUT/probe_old" $H/gemm_scale_leaky.py > "$OUT/probe_old.log" 2>&1
echo "probe (old templates) rc=$?"; tail -9 "$OUT/probe_old.log"
timeout "${T:-300}" python3 bench/percall_probe.py --out "$OUT/probe" $H/gemm_scale_leaky.py \
  $H/pointwise_bias_swish.py $H/norm_rms_wide.py > "$OUT/probe.log" 2>&1
echo "probe rc=$?"; tail -24 "$OUT/probe.log"
