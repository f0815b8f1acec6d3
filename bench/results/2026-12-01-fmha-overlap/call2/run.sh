#!/usr/bin/env bash
# Session 13, device call 2: the FMHA's Q stages (two tiles' worth: the persistent kernel loads
# the next tile's Q during this one) with and without the overlapped mainloop, named configs
# (--configs) at the MiniGPT and Llama shapes in bf16 and the MiniGPT shape in TF32, verified and
# timed against SDPA in one run by bench/gemm_bench.py.
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/empty.db PYTHON=python3 PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
BF=q128kv128_pp_s5,q128kv128_pp_s5_ov,q128kv128_pp_s5_q4,q128kv128_pp_s5_q4_ov,q128kv128_pp_s4_q4,q128kv128_pp_s4_q4_ov,q128kv128_coop_s5_ov
TF=q128kv64_pp_s5_tf32,q128kv64_pp_s4_q4_tf32,q128kv64_pp_s4_q4_ov_tf32,q128kv64_coop_s5_tf32,q128kv64_coop_s5_ov_tf32
timeout 330 python3 -m fact realize bench/problems/attention_minigpt.py --dtype bf16 --configs $BF \
  --out .gpu/att/attention_minigpt_bf16 > $OUT/realize-minigpt.log 2>&1 &
timeout 330 python3 -m fact realize bench/problems/attention_llama.py --dtype bf16 --configs $BF \
  --out .gpu/att/attention_llama_bf16 > $OUT/realize-llama.log 2>&1 &
timeout 330 python3 -m fact realize bench/problems/attention_minigpt.py --dtype fp32 --precision high --configs $TF \
  --out .gpu/att/attention_minigpt_tf32 > $OUT/realize-minigpt-tf32.log 2>&1 &
wait
echo "realized $(( $(date +%s) - t0 )) s"; grep -h "realized into\|FAILED" $OUT/realize-*.log
for f in .gpu/cache/failed-*/build.log; do [ -f "$f" ] && { echo "== $f"; grep -m3 error "$f"; }; done
timeout 240 python3 bench/gemm_bench.py .gpu/att --out $OUT/att > $OUT/att.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/att/gemm_bench.json"))
for r in d["results"]:
    rows = r.get("rows") or []
    print(r.get("source"), "eager_us", r.get("eager_us"), "fact_us", r.get("fact_us"))
    for row in sorted(rows, key=lambda x: x.get("time_us") or 1e9):
        print("  ", (row.get("kernel") or "")[-40:], row.get("disposition"), round(row.get("time_us") or 0, 1))
PY
