set -u
tar xzf .device/lk8.tgz
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT
export OUT=$O/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv > $OUT/smi.txt
timeout 200 python3 bench/gemm_bench.py .device/lk8 --out $OUT/bench > $OUT/bench.log 2>&1; echo "bench rc=$?"
K='[{"raster":"heuristic","max_swizzle":1,"splits":1},{"raster":"heuristic","max_swizzle":1,"splits":1,"reduction":"nondeterministic"},{"raster":"along_m","max_swizzle":1,"splits":1,"reduction":"nondeterministic"},{"raster":"heuristic","max_swizzle":1,"splits":16,"reduction":"nondeterministic"},{"raster":"heuristic","max_swizzle":1,"splits":33,"reduction":"nondeterministic"},{"raster":"heuristic","max_swizzle":1,"splits":66,"reduction":"nondeterministic"}]'
timeout 150 python3 -m fact.tune.harness .device/lk8/gemm_large_k_bf16/plan.json --kernels .device/lk8/gemm_large_k_bf16 --out $OUT/lk_reduction.json --knobs "$K" > $OUT/knobs.log 2>&1; echo "knobs rc=$?"
FACT_TEST_KERNELS=.device/lk8/gemm_large_k_bf16 timeout 200 scripts/gpu_tests.sh -k manifest > $OUT/gpu_tests_manifest.log 2>&1; echo "tests rc=$?"
tail -3 $OUT/gpu_tests_manifest.log
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/lk_reduction.json"))
for r in d["rows"]:
    kt = " ".join(f"{k['name']}={k['time_us']:.1f}" if k.get("time_us") else f"{k['name']}=-" for k in r.get("knob_times", []))
    print(f"{r['config'].get('name')[:48]:48s} {r['disposition']:8s} {r['time_us'] or 0:7.1f} {kt}")
PY
tail -12 $OUT/bench.log | cut -c1-200
