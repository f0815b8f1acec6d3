#!/usr/bin/env bash
# Stage 2 for the attention benchmarks of shared/BENCHMARKS.md (issue 4): plan each problem, emit
# and compile its CUTLASS Hopper FMHA candidates (bf16) into run directories under $1 (default
# .device/attention), ready for bench/gemm_bench.py, which verifies and times them against
# scaled_dot_product_attention and the hand-written eager module in one run. The MiniGPT shape
# also in fp32 with TF32 allowed (precision high: the sm80 kernel in TF32 math). Compiling on the
# GPU machine (16 cores) takes about a minute and a half.
# `wait` on each pid: a failed realize fails the script (set -e).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.device/attention}
candidates=${CANDIDATES:-6}
fact=${FACT:-.venv/bin/fact}  # a command: "python3 -m fact" on a bare machine
mkdir -p "$out"
# Both problems at once: each nvcc is single-threaded, and one problem has fewer kernels than cores.
pids=()
for problem in attention_minigpt attention_llama; do
  $fact realize "bench/problems/$problem.py" --dtype bf16 --candidates "$candidates" --out "$out/${problem}_bf16" &
  pids+=($!)
done
$fact realize bench/problems/attention_minigpt.py --dtype fp32 --precision high --candidates "$candidates" \
  --out "$out/attention_minigpt_tf32" &
pids+=($!)
for pid in "${pids[@]}"; do wait "$pid"; done
