#!/usr/bin/env bash
# Session 12, device call 7: the causal tile order in groups of one (batch, head) pair a CTA
# (each CTA does all query tiles of its pair, heaviest first; the pairs in flight keep K/V in
# L2): the MiniGPT shape's ping-pong kernel (realized on the CPU machine) against SDPA.
set -uo pipefail
export PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
tar xzf .device/g2.tgz -C .device
timeout 200 python3 bench/gemm_bench.py .device/g2 --out $OUT/att > $OUT/att.log 2>&1; echo "bench rc=$?"
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/att/gemm_bench.json"))
for r in d["results"]:
    print(r.get("source"), r.get("fact_us"))
    for row in sorted(r.get("rows") or [], key=lambda x: x.get("time_us") or 1e9):
        print("  ", (row.get("kernel") or "")[-40:], row.get("disposition"), round(row.get("time_us") or 0, 1))
PY
