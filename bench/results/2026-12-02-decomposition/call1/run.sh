#!/usr/bin/env bash
# Session 17, device call 1: the stream-K decomposition knob (ABI 5) on the plain GEMMs that sit
# behind cuBLAS: square 4096 and batched 128x512x1024x2048 in bf16 and TF32 (B K-major), each with
# its persistent kernels and their stream_k twins (realized on the CPU machine by
# .device/sk/realize*.sh), bench/gemm_bench.py with eager and torch.compile in the same process.
set -u
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
timeout 480 python3 bench/gemm_bench.py .device/sk --out $OUT/sk > $OUT/sk.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t0 )) s"
sed -n '/^| workload | dtype/,/^$/p' $OUT/sk/gemm_bench.md | cut -d'|' -f2-10
sed -n '/^| workload | dtype | eager/,/^$/p' $OUT/sk/gemm_bench.md | cut -d'|' -f2-8
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/sk/gemm_bench.json"))
for r in d["results"]:
    print(r["run"])
    for row in r["rows"]:
        kt = {e["name"]: e.get("time_us") for e in row.get("knob_times") or []}
        keep = {k: v for k, v in kt.items() if k in ("r_heur_s1_k1", "r_heur_s1_k1_sk", "r_heur_s1_k1_nd", "r_heur_s1_k1_nd_sk")}
        best = min((v for v in kt.values() if v), default=None)
        print(f"  {row['kernel'][-48:]:48s} {row['time_us'] or 0:8.1f} best={best} " + " ".join(f"{k[7:] or 'heur'}={v:.1f}" for k, v in keep.items() if v))
PY
