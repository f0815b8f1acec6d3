#!/usr/bin/env bash
# Session 10, device call 4: TF32 plain GEMMs (issue 3): ping-pong on the square GEMM (never
# measured there), more ping-pong tiles on the batched one; bench/gemm_bench.py.
set -uo pipefail
tar xzf .device/g10.tgz -C .device
export PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
timeout 500 python3 bench/gemm_bench.py .device/g10 --out $OUT/g10 > $OUT/g10.log 2>&1; echo "bench rc=$?"
sed -n '/| workload/,$p' $OUT/g10/gemm_bench.md | cut -c1-220
python3 - <<'P'
import json, os
d = json.load(open(os.environ["OUT"] + "/g10/gemm_bench.json"))
for run in d["results"]:
    for r in sorted(run["rows"], key=lambda r: r.get("time_us") or 1e9):
        print(run["run"], r["kernel"][-52:], r["disposition"], r.get("time_us") and round(r["time_us"], 1))
P
# Realized on the CPU machine before (FACT at the tuner-watchdog commit):
#   C=t128x128x32_c2x1_pp_tma_sauto_persistent_tf32,t128x128x32_c1x2_pp_tma_sauto_persistent_tf32,t128x256x32_c2x1_coop_tmacoop_sauto_persistent_tf32
#   fact realize bench/problems/gemm_square_tn.py --dtype fp32 --precision high --configs $C --out .device/g10/gemm_square_tn_tf32
#   C=t128x128x32_c1x1_pp_tma_sauto_persistent_tf32,t128x128x32_c2x1_pp_tma_sauto_persistent_tf32,t128x64x32_c1x2_pp_tma_sauto_persistent_tf32,t64x128x32_c2x1_pp_tma_sauto_persistent_tf32
#   fact realize bench/problems/gemm_batched_tn.py --dtype fp32 --precision high --configs $C --out .device/g10/gemm_batched_tn_tf32
#   tar czf .device/g10.tgz -C .device g10
