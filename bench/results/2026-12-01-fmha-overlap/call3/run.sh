#!/usr/bin/env bash
# Session 13, device call 3: the attention GPU tests at the revision where the prior puts the
# overlapped mainloop and the second tile's Q first (an empty registry: the prior's top 2 configs
# per run are realized and verified: causal, grouped-query, multi-query, ragged, own scale, bf16
# and fp32).
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/empty.db PYTHON=python3 PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
t0=$(date +%s)
timeout 540 scripts/gpu_tests.sh -k "attention" > $OUT/gpu_tests_attention.log 2>&1; echo "attention tests rc=$? $(( $(date +%s) - t0 )) s"
grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/gpu_tests_attention.log | tail -40
