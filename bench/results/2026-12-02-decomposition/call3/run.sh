#!/usr/bin/env bash
# Session 17, device call 3: the epilogue subtile. Copies of generated cooperative kernels with
# the epilogue tile fixed at 128x64 or 128x128 instead of CUTLASS's auto 128x32 (.device/epi/
# build.sh edits the sources; an experiment, not FACT output), beside the unedited kernels, on
# the square and batched GEMMs in bf16 and TF32: bench/gemm_bench.py, eager and torch.compile in
# the same process.
set -u
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
timeout 480 python3 bench/gemm_bench.py .device/epi --out $OUT/epi > $OUT/epi.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t0 )) s"
sed -n '/^| workload | dtype | eager/,/^$/p' $OUT/epi/gemm_bench.md | cut -d'|' -f2-8
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/epi/gemm_bench.json"))
for r in d["results"]:
    print(r["run"], "fact", r.get("fact_kernel", "")[-50:])
    for row in r["rows"]:
        print(f"  {row['kernel'][-52:]:52s} {row['time_us'] or 0:8.1f} {row['disposition']} {row.get('error')}")
PY
