#!/usr/bin/env bash
# Session 12, device call 6, at the review fixes (grouped kernel: m/k checks, 64-bit sizes, the
# shared grid fragment; plain kernels refuse parts): the horizontal GEMM GPU tests, bf16 and TF32.
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/registry.db PYTHON=python3 PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
t0=$(date +%s)
timeout 280 scripts/gpu_tests.sh -k "horizontal" > $OUT/gpu_tests_horizontal.log 2>&1; echo "horizontal tests rc=$? $(( $(date +%s) - t0 )) s"
tail -n 4 $OUT/gpu_tests_horizontal.log
