#!/usr/bin/env bash
# Session 17, device call 4: shared/BENCHMARKS.md's GEMMs with the ranking model of this session
# (stream-K fixup as partial tiles, the stream-K scheduler's 2 %, twins sharing a top-N slot):
# CANDIDATES=4 bench/realize_gemm.sh .device/g17 (bf16) and SETS=tf32 (B K-major) on the CPU
# machine, seeded registry; bench/gemm_bench.py with eager and torch.compile in the same process.
set -u
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
timeout 500 python3 bench/gemm_bench.py .device/g17 --out $OUT/g17 > $OUT/g17.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t0 )) s"
sed -n '/^| workload | dtype | precision/,/^$/p' $OUT/g17/gemm_bench.md | cut -d'|' -f2-10 | cut -c1-200
sed -n '/^| workload | dtype | eager/,/^$/p' $OUT/g17/gemm_bench.md | cut -d'|' -f2-8
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/g17/gemm_bench.json"))
for r in d["results"]:
    print(r["run"])
    for row in r["rows"]:
        print(f"  {row['kernel'][-52:]:52s} {row['time_us'] or 0:8.1f} {row['disposition']} {row.get('knobs')}")
PY
