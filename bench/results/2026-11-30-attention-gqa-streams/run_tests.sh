set -u
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache FACT_REGISTRY=$PWD/.gpu/registry.db PYTHON=python3 PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT
export OUT=$O/r
timeout 270 scripts/gpu_tests.sh -k "test_compose_gpu and attention" > $OUT/gpu_tests_compose_attention.log 2>&1; echo "rc=$?"
tail -6 $OUT/gpu_tests_compose_attention.log
