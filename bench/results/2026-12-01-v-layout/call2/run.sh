#!/usr/bin/env bash
# Session 15, device call 2: the V transpose's tile shapes (microbenchmark), and the generated
# row-norm kernels before (old/) and after (new/) a warp per row with several rows a block.
set -uo pipefail
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
timeout 60 .device/tb/transpose_bench > $OUT/transpose_bench.md 2>&1; echo "transpose rc=$? $(( $(date +%s) - t0 )) s"
for v in old new; do
  timeout 150 python3 bench/norm_bench.py .device/norm/$v/mg .device/norm/$v/lnf32 .device/norm/$v/rms > $OUT/norm_$v.md 2>&1
  echo "norm $v rc=$? $(( $(date +%s) - t0 )) s"
done
cat $OUT/transpose_bench.md; cat $OUT/norm_old.md | cut -c1-200; cat $OUT/norm_new.md | cut -c1-200
