#!/usr/bin/env bash
# Run FACT's GPU tests (pytest marker `gpu`) on the GPU machine (an H200; CPU machines skip them).
#
# Environment (all optional):
#   FACT_TEST_KERNELS    kernel manifest to verify and time: a JSON list of
#                        {"pattern_index", "kernel", "library", "config"} (library paths relative
#                        to the manifest), or {"plan": PLAN.json, "kernels": [...]}; without it the
#                        per-kernel tests skip and only the harness's own GPU tests run
#   FACT_TEST_PLAN       the plan (`fact discover --json`) that a list manifest's pattern_index
#                        refers to
#   FACT_TEST_PROBLEM    JSON sizes on top of each pattern's problem, to bound the run time,
#                        e.g. '{"m": 8192}' (default: the plan's problem)
#   FACT_TEST_PRECISION  float32 matmul precision for the kernel checks: highest | high | medium
#                        (default highest)
#   FACT_TEST_NVCC       nvcc for the illegal-address test's deliberately faulting kernel
#                        (default: nvcc on PATH, else $CUDA_HOME/bin/nvcc; the test skips without)
#   FACT_TEST_ATTENTION_RUNS
#                        folder of realized attention problems (run directories named after the
#                        problems `python tests/python/test_tune_gpu.py DIR` writes); without it
#                        the attention tests realize them here (needs nvcc, fact-engine and
#                        CUTLASS with examples/88_hopper_fmha and 41_fused_multi_head_attention;
#                        ~3 minutes on 16 cores)
#   PYTHON               the interpreter (default python3); it needs torch with CUDA and pytest
#
# Extra arguments go to pytest, e.g. scripts/gpu_tests.sh -k manifest -s, or
# scripts/gpu_tests.sh tests/python/test_compose_gpu.py -k attention (that file's tests only)
set -euo pipefail
cd "$(dirname "$0")/.."
# A plain checkout imports fact from python/ (pyproject's pytest `pythonpath` says the same; the
# tuning workers, separate processes, get it from fact.tune.harness itself)
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
# Test files or node ids among the arguments narrow the run; without any, every GPU test runs
paths=(tests/python)
for a in "$@"; do
  if [ -e "${a%%::*}" ]; then paths=(); break; fi
done
"${PYTHON:-python3}" -m pytest -q -rA -m gpu "${paths[@]}" "$@"
