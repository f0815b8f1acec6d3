#!/usr/bin/env bash
# Session 16, device call 3: the attention tuner now makes V as the plan lays it out (keys
# contiguous after fact.layouts' V^T rewrite). The composed fp32/TF32 attention GPU tests, then
# scripts/gpu_bench.sh minigpt-tf32 again (cold kernel cache, seeded registry, eager and
# torch.compile in the same run): its attention tuning rows now time the V that runs.
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/registry.db PYTHON=python3 PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r RUNS=$PWD/.gpu/runs
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
timeout 200 scripts/gpu_tests.sh tests/python/test_compose_gpu.py -k "attention and tf32" -v > $OUT/gpu_tests_compose_attention_tf32.log 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/gpu_tests_compose_attention_tf32.log | grep -v "^tests/" | cut -c1-200 | tail -6
t1=$(date +%s)
timeout $(( 540 - (t1 - t0) )) scripts/gpu_bench.sh minigpt-tf32 > $OUT/bench.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t1 )) s"
grep -E "end-to-end|done:" $OUT/minigpt-tf32.log | cut -c1-240
sed -n '/| module/,/^$/p' $OUT/minigpt-tf32/report.md 2>/dev/null | head -7 | cut -d'|' -f2-8
grep -E "^\| [0-9]" $OUT/minigpt-tf32/report.md 2>/dev/null | cut -d'|' -f2-7 | cut -c1-200
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/minigpt-tf32/report.json"))
for p in d["optimize"]["patterns"]:
    if p["family"] == "attention":
        for r in p["tuning"]: print("tuning", r["kernel"], r["time_us"])
        for c in p["candidates"]: print("context", c["impl"], c["time_us"])
PY
