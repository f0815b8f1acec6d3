#!/usr/bin/env bash
# Session 17, device call 7: the compile driver's new default (every kernel at once up to 1.5x
# the cores): a cold `fact realize` of the MiniGPT block in bf16 with 4 candidates a pattern
# (the kernels fact.optimize compiles; seeded registry, empty kernel cache) on the 16-core GPU
# machine. Call 6's optimize compiled the same 21 kernels 16 at a time in 119 s.
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/registry.db PYTHON=python3 PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nproc; $FACT_ENGINE registry import data/registry_seed.json > /dev/null
t0=$(date +%s.%N)
timeout 200 python3 -m fact realize examples/minigpt_block.py --dtype bf16 --precision high --candidates 4 --out .gpu/mg > $OUT/realize.log 2>&1; rc=$?
echo "realize rc=$rc $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
grep -E "compiling|realized into" $OUT/realize.log
