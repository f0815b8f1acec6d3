#!/usr/bin/env bash
# Session 15, device call 1: the V-layout probe (TF32 and bf16).
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/empty.db PYTHON=python3 PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
for dt in fp32 bf16; do
  timeout 120 python3 bench/v_layout_probe.py --dtype $dt > $OUT/v_layout_$dt.md 2>&1; echo "probe $dt rc=$? $(( $(date +%s) - t0 )) s"
done
cat $OUT/v_layout_fp32.md $OUT/v_layout_bf16.md
