#!/usr/bin/env bash
# Session 15, device call 3: TF32 attention reading V keys-contiguous in place (ABI version 4).
# 1. bench/attention_v_layout.py on the MiniGPT and Llama TF32 attention kernels realized on the
#    CPU machine (.device/att): V as the model leaves it against V keys-contiguous.
# 2. the attention GPU tests (realized here from an empty registry), with the new
#    test_attention_v_with_its_keys_contiguous.
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/empty.db PYTHON=python3 PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
timeout 120 python3 bench/attention_v_layout.py .device/att/minigpt_tf32 .device/att/llama_tf32 > $OUT/attention_v_layout.md 2>&1
echo "v layout rc=$? $(( $(date +%s) - t0 )) s"
timeout 420 scripts/gpu_tests.sh -k "attention" > $OUT/gpu_tests_attention.log 2>&1; echo "attention tests rc=$? $(( $(date +%s) - t0 )) s"
cat $OUT/attention_v_layout.md
grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/gpu_tests_attention.log | tail -45 | cut -c1-200
