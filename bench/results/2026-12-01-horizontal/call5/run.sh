#!/usr/bin/env bash
# Session 12, device call 5: the TF32 FMHA configs at the MiniGPT shape (fp32, precision high)
# after the causal heaviest-first tile order: every config (--candidates 24, empty registry),
# verified and timed against SDPA by bench/gemm_bench.py.
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/empty.db PYTHON=python3 PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
timeout 300 python3 -m fact realize bench/problems/attention_minigpt.py --dtype fp32 --precision high --candidates 24 \
  --out .gpu/att/attention_minigpt_tf32 > $OUT/realize.log 2>&1
echo "realized rc=$? $(( $(date +%s) - t0 )) s"; grep -h "realized into" $OUT/realize.log
timeout 240 python3 bench/gemm_bench.py .gpu/att --out $OUT/att > $OUT/att.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/att/gemm_bench.json"))
for r in d["results"]:
    print(r.get("source"), "eager_us", r.get("eager_us"), "fact_us", r.get("fact_us"))
    for row in sorted(r.get("rows") or [], key=lambda x: x.get("time_us") or 1e9):
        print("  ", (row.get("kernel") or "")[-44:], row.get("disposition"), round(row.get("time_us") or 0, 1))
PY
