#!/usr/bin/env bash
# Session 10 (2026-12-01): TF32 GEMMs of the MiniGPT block, cooperative vs ping-pong; then the
# blocks after the ranking model change. Three device calls (H200), commands as run.
#
# On the CPU machine, before call 1 (engine at the session's start; configs named explicitly):
#   C=t128x256x32_c2x1_coop_tmacoop_sauto_persistent_tf32,t256x128x32_c1x2_coop_tmacoop_sauto_persistent_tf32,\
#     t128x128x32_c2x1_pp_tma_sauto_persistent_tf32,t128x128x32_c1x2_pp_tma_sauto_persistent_tf32,\
#     t64x256x32_c2x1_pp_tma_sauto_persistent_tf32
#   FACT_REGISTRY=/tmp/ppreg.db fact realize examples/minigpt_block.py --dtype fp32 --precision high \
#     --configs $C --jobs 2 --out .device/pp/minigpt_tf32
#   tar czf .device/pp.tgz -C .device pp
#
# Call 1 (gemm_bench.md/json/log, smi-call1.txt); gemm_bench then skipped norm patterns with a
# note (the module total was dropped from the table afterwards: it lacked the norms).
tar xzf .device/pp.tgz -C .device
export PYTHONPATH=$PWD/python
python3 bench/gemm_bench.py .device/pp --out $OUT/pp
#
# Between calls 1 and 2: the epilogue and stage terms of the ranking model, and call 1's 20 GEMM
# rows added to data/registry_seed.json. Between calls 2 and 3: configs measured on the problem
# itself rank in their measured order. .device/bin/fact-engine = strip of build/fact-engine.
#
# Calls 2 (call2/: minigpt-tf32, minigpt-bf16) and 3 (minigpt-tf32, llama-bf16; the run of record):
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/registry.db RUNS=$PWD/.gpu/runs PYTHON=python3 PYTHONPATH=$PWD/python
for job in minigpt-tf32 minigpt-bf16; do scripts/gpu_bench.sh $job; done   # call 2
for job in minigpt-tf32 llama-bf16; do scripts/gpu_bench.sh $job; done     # call 3
#
# Call 5 (after call 4, g10/run.sh): the Llama block in fp32 with TF32 allowed (llama-tf32.*),
# same environment as calls 2-3:
JOB_TIMEOUT=480 scripts/gpu_bench.sh llama-tf32
#
# Call 6, at the final revision (review fixes): the GPU tests, same environment as calls 2-3
# (gpu_tests_tune.log: 7 passed, 1 skipped; gpu_tests_compose.log: 10 passed).
scripts/gpu_tests.sh -k "test_tune_gpu and not realized_attention"
scripts/gpu_tests.sh -k "test_compose_gpu and not attention"
#
# Call 7, at the final revision (final/): the MiniGPT blocks again, same environment.
for job in minigpt-tf32 minigpt-bf16; do scripts/gpu_bench.sh $job; done
