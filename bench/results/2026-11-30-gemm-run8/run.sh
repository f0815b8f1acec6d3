set -u
tar xzf .device/tf8.tgz; tar xzf .device/sq8.tgz
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT
export OUT=$O/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv > $OUT/smi.txt
timeout 170 python3 bench/gemm_bench.py .device/tf8 --out $OUT/tf32 > $OUT/tf32.log 2>&1; echo "tf32 rc=$?"
timeout 120 python3 bench/gemm_bench.py .device/sq8 --out $OUT/bf16 > $OUT/bf16.log 2>&1; echo "bf16 rc=$?"
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache FACT_REGISTRY=$PWD/.gpu/registry.db PYTHON=python3
timeout 250 scripts/gpu_tests.sh -k compose_gpu > $OUT/gpu_tests_compose.log 2>&1; echo "compose tests rc=$?"
tail -2 $OUT/gpu_tests_compose.log
for f in $OUT/tf32/gemm_bench.md $OUT/bf16/gemm_bench.md; do sed -n '/^| workload | dtype/,/^$/p' $f | cut -c1-200; done
