#!/usr/bin/env bash
# Session 16, device call 4: at the revision where the attention tuner makes V as the plan lays
# it out and a keys-contiguous V has its own registry signature (`:v_keys`): the MiniGPT block
# in fp32 with TF32 allowed, cold kernel cache, seeded registry (which has no `:v_keys` rows, so
# the attention candidates come from the prior and are tuned on the V that runs),
# scripts/gpu_bench.sh minigpt-tf32 with eager and torch.compile in the same run; then the
# registry's new attention rows, exported for the seed.
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/registry.db PYTHON=python3 PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r RUNS=$PWD/.gpu/runs
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
timeout 330 scripts/gpu_bench.sh minigpt-tf32 > $OUT/bench.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t0 )) s"
$FACT_ENGINE registry export --registry $FACT_REGISTRY > $OUT/registry_export.json 2> $OUT/registry_export.err || \
  $FACT_ENGINE registry export > $OUT/registry_export.json 2>> $OUT/registry_export.err
grep -c v_keys $OUT/registry_export.json
grep -E "layout|end-to-end|done:" $OUT/minigpt-tf32.log | cut -c1-200
sed -n '/| module/,/^$/p' $OUT/minigpt-tf32/report.md 2>/dev/null | head -7 | cut -d'|' -f2-8
grep -E "^\| [0-9]" $OUT/minigpt-tf32/report.md 2>/dev/null | cut -d'|' -f2-7 | cut -c1-200
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/minigpt-tf32/report.json"))
for p in d["optimize"]["patterns"]:
    if p["family"] == "attention":
        print(p["signature"])
        for r in p["tuning"]: print("tuning", r["kernel"][-30:], r["time_us"], r["source"])
        for c in p["candidates"]: print("context", c["impl"][-30:], c["time_us"])
PY
