#!/usr/bin/env bash
# Session 17, device call 5: cluster shapes the ranking leaves out, on the GEMMs still 1-2 %
# behind cuBLAS: square 4096 bf16 (128x256 and 256x128 cooperative, clusters 1x1, 1x2, 2x1),
# batched bf16 and TF32 (ping-pong 128x128, clusters 2x1, 1x1, 1x2); realized by
# .device/cl/realize.sh; bench/gemm_bench.py with eager and torch.compile in the same process.
set -u
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
timeout 400 python3 bench/gemm_bench.py .device/cl --out $OUT/cl > $OUT/cl.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t0 )) s"
sed -n '/^| workload | dtype | eager/,/^$/p' $OUT/cl/gemm_bench.md | cut -d'|' -f2-8
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/cl/gemm_bench.json"))
for r in d["results"]:
    print(r["run"])
    for row in r["rows"]:
        print(f"  {row['kernel'][-52:]:52s} {row['time_us'] or 0:8.1f} {row['disposition']} {row.get('knobs')}")
PY
