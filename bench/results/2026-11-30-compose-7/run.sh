set -u
T0=$(date +%s)
tar xzf .device/tb10.tgz
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache FACT_REGISTRY=$PWD/.gpu/registry.db RUNS=$PWD/.gpu/runs PYTHON=python3 PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT
export OUT=$O/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv > $OUT/smi.txt
PYTHONPATH=$PWD/python timeout 90 python3 bench/gemm_bench.py .device/tb10 --out $OUT/tb10 > $OUT/tb10.log 2>&1; echo "tb10 rc=$?"
timeout 190 scripts/gpu_bench.sh minigpt-bf16 > $OUT/minigpt.log 2>&1; echo "minigpt rc=$?"
timeout 220 scripts/gpu_bench.sh llama-bf16 > $OUT/llama.log 2>&1; echo "llama rc=$?"
left=$(( 575 - ($(date +%s) - T0) ))
[ $left -gt 60 ] && { timeout $left scripts/gpu_bench.sh minigpt-tf32 > $OUT/tf32.log 2>&1; echo "tf32 rc=$? (limit $left s)"; }
sed -n '/^| workload | dtype | eager/,/^$/p' $OUT/tb10/gemm_bench.md | cut -c1-160
for j in minigpt-bf16 llama-bf16 minigpt-tf32; do echo "== $j"; grep -A6 "^| module | time" $OUT/$j/report.md 2>/dev/null | cut -c1-140; grep -a "replaced\|to optimize" $OUT/$j/report.md 2>/dev/null | head -2 | cut -c1-160; done
