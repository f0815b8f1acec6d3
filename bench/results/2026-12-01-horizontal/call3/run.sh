#!/usr/bin/env bash
# Session 12, device call 3: the cooperative FMHA made persistent with the causal heaviest-first
# order (a hand-edited kernel: kPersistent = true), against call 2's kernels, same machine.
set -uo pipefail
export PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
tar xzf .device/cp.tgz -C .device
mkdir -p .gpu/att2 && cp -r .device/cp/attention_minigpt_coop_persistent .gpu/att2/ && cp -r .gpu/att/attention_minigpt_bf16 .gpu/att2/
timeout 300 python3 bench/gemm_bench.py .gpu/att2 --out $OUT/att2 > $OUT/att2.log 2>&1; echo "bench rc=$?"
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/att2/gemm_bench.json"))
for r in d["results"]:
    print(r.get("source"), r.get("fact_us"))
    for row in sorted(r.get("rows") or [], key=lambda x: x.get("time_us") or 1e9)[:6]:
        print("  ", (row.get("kernel") or "")[-40:], row.get("disposition"), round(row.get("time_us") or 0, 1))
PY
