#!/usr/bin/env bash
# Session 13, device call 1: the overlapped FMHA mainloop (each warp group's softmax overlapping
# its own P @ V). Every bf16 FMHA config at the MiniGPT and Llama shapes (--candidates 30, an
# empty registry so nothing is skipped), verified and timed against SDPA in one run by
# bench/gemm_bench.py.
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/empty.db PYTHON=python3 PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
pids=()
for problem in attention_minigpt attention_llama; do
  timeout 330 python3 -m fact realize bench/problems/$problem.py --dtype bf16 --candidates 30 \
    --out .gpu/att/${problem}_bf16 > $OUT/realize-$problem.log 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait $pid; done
echo "realized $(( $(date +%s) - t0 )) s"; grep -h "realized into" $OUT/realize-*.log
timeout 220 python3 bench/gemm_bench.py .gpu/att --out $OUT/att > $OUT/att.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/att/gemm_bench.json"))
for r in d["results"]:
    rows = r.get("rows") or []
    print(r.get("source"), "eager_us", r.get("eager_us"), "fact_us", r.get("fact_us"))
    for row in sorted(rows, key=lambda x: x.get("time_us") or 1e9):
        print("  ", (row.get("kernel") or "")[-40:], row.get("disposition"), round(row.get("time_us") or 0, 1))
PY
