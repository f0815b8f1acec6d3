# Session 9 (2026-11-30): three device calls, run from the repository root on the H200.
# .device/ (ignored) held: cutlass.tgz (include/, tools/util/include, examples/88_hopper_fmha,
# examples/41_fused_multi_head_attention of the nvidia-cutlass wheel), bin/fact-engine (this
# revision, stripped), attruns.tgz (the attention test runs realized on the CPU machine with
#   python tests/python/test_tune_gpu.py .device/attruns  # prints the fact realize commands, run them),
# att32b.tgz (bench/problems/attention_minigpt.py realized on the CPU machine with an empty registry:
#   FACT_REGISTRY=/tmp/empty.db fact realize bench/problems/attention_minigpt.py --dtype fp32 \
#     --precision high --candidates 11 --out .device/att32b/attention_minigpt_tf32).
# Call 1 (not kept) ran the same as call 2 with 2-stage TF32 kernels in the space: the tests
# passed (16), and the benchmark hung on a 2-stage kernel (the mainloop deadlocks with two K/V
# stages); the space now starts at three, and V is rounded to TF32 when it is transposed.
# Calls 2 and 3 ran the revision before the review fixes; their results are in first/. Call 4
# ran the final revision (attruns and att32b realized again with it); its results are here.

# ---- .device/run_a2.sh
# Session 9, device call 2 (after the review of call 1: no 2-stage kernels, V rounded to TF32):
# the attention GPU tests, then the fp32 kernels alone at the MiniGPT shape (empty registry:
# 6 Hopper TF32 configs and the 5 sm80 TF32 ones).
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass && rm -rf .device/attruns .device/att32b && tar xzf .device/attruns.tgz -C .device && tar xzf .device/att32b.tgz -C .device
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/registry.db RUNS=$PWD/.gpu/runs PYTHON=python3 PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
FACT_TEST_ATTENTION_RUNS=$PWD/.device/attruns timeout 150 scripts/gpu_tests.sh -k "realized_attention" -s \
  > $OUT/gpu_tests_tune_attention.log 2>&1; echo "tune-attention rc=$? $(( $(date +%s) - t0 )) s"
grep -E "passed|failed|error" $OUT/gpu_tests_tune_attention.log | tail -3
grep -E "^FAILED|^ERROR" $OUT/gpu_tests_tune_attention.log | cut -c1-300 | head
grep -E "^fact_attention_f32.*us" $OUT/gpu_tests_tune_attention.log | sed 's/fact_attention_//' | head -40
timeout 380 python3 bench/gemm_bench.py .device/att32b --out $OUT/att32b > $OUT/att32b.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t0 )) s"
cat $OUT/att32b/*.md 2>/dev/null | grep -E "^\|" | cut -c1-260 | head -30
tail -5 $OUT/att32b.log | cut -c1-300

# ---- .device/run_a3.sh
# Session 9, device call 3: the MiniGPT TF32 block (Hopper FMHA in TF32 among the attention
# candidates, seeded registry), then the composed fp32 attention GPU tests.
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache3 \
  FACT_REGISTRY=$PWD/.gpu/registry3.db RUNS=$PWD/.gpu/runs PYTHON=python3 PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
timeout 300 scripts/gpu_bench.sh minigpt-tf32 > $OUT/minigpt-tf32.out 2>&1; echo "minigpt-tf32 rc=$? $(( $(date +%s) - t0 )) s"
sed -n '/| module/,/^$/p' $OUT/minigpt-tf32/report.md 2>/dev/null | head -7 | cut -d'|' -f2-7
grep -E "attention" $OUT/minigpt-tf32/report.md | tail -1 | cut -c1-400
timeout $(( 560 - ($(date +%s) - t0) )) scripts/gpu_tests.sh -k "test_compose_gpu and attention" > $OUT/gpu_tests_compose_attention.log 2>&1
echo "compose-attention rc=$? $(( $(date +%s) - t0 )) s"; tail -3 $OUT/gpu_tests_compose_attention.log | cut -c1-300

# ---- .device/run_a4.sh
# Session 9, device call 4 (final revision, after the review fixes): the attention GPU tests
# (now with fp32 grouped-query on Hopper's TF32 kernel), the fp32 kernels alone at the MiniGPT
# shape, and the MiniGPT TF32 block (registry seeded with this session's rows).
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass && rm -rf .device/attruns .device/att32b && tar xzf .device/attruns.tgz -C .device && tar xzf .device/att32b.tgz -C .device
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache4 \
  FACT_REGISTRY=$PWD/.gpu/registry4.db RUNS=$PWD/.gpu/runs PYTHON=python3 PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
FACT_TEST_ATTENTION_RUNS=$PWD/.device/attruns timeout 170 scripts/gpu_tests.sh -k "realized_attention" -s \
  > $OUT/gpu_tests_tune_attention.log 2>&1; echo "tune-attention rc=$? $(( $(date +%s) - t0 )) s"
grep -E "passed|failed|error" $OUT/gpu_tests_tune_attention.log | tail -3
grep -E "^FAILED|^ERROR" $OUT/gpu_tests_tune_attention.log | cut -c1-300 | head
grep -E "^fact_attention_f32.*us" $OUT/gpu_tests_tune_attention.log | sed 's/fact_attention_//' | head -40
timeout 200 python3 bench/gemm_bench.py .device/att32b --out $OUT/att32b > $OUT/att32b.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t0 )) s"
cat $OUT/att32b/*.md 2>/dev/null | grep -E "^\| attention" | cut -c1-260 | head -3
timeout $(( 560 - ($(date +%s) - t0) )) scripts/gpu_bench.sh minigpt-tf32 > $OUT/minigpt-tf32.out 2>&1; echo "minigpt-tf32 rc=$? $(( $(date +%s) - t0 )) s"
sed -n '/| module/,/^$/p' $OUT/minigpt-tf32/report.md 2>/dev/null | head -7 | cut -d'|' -f2-7
grep -E "attention" $OUT/minigpt-tf32/report.md | tail -1 | cut -c1-300

# ---- .device/run_a5.sh (results in profile/: the final revision's kernels before the transpose change)
# Session 9, device call 5: the MiniGPT TF32 block with --profile (where the 0.25 ms between
# patterns goes).
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache5 \
  FACT_REGISTRY=$PWD/.gpu/registry5.db RUNS=$PWD/.gpu/runs PYTHON=python3 PYTHONPATH=$PWD/python BENCH_FLAGS=--profile
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
t0=$(date +%s)
timeout 400 scripts/gpu_bench.sh minigpt-tf32 > $OUT/minigpt-tf32.out 2>&1; echo "minigpt-tf32 rc=$? $(( $(date +%s) - t0 )) s"
sed -n '/| module/,/^$/p' $OUT/minigpt-tf32/report.md 2>/dev/null | head -7 | cut -d'|' -f2-7
sed -n '/GPU timeline/,$p' $OUT/minigpt-tf32/report.md | grep -v "^$" | cut -c1-220 | head -60

# ---- .device/run_a6.sh (results in transpose16/; attruns: the fp32 TF32 runs realized again, the others copied from call 4)
# Session 9, device call 6: after the V transpose moved to 16-byte accesses (64 x 32 tiles): the
# attention GPU tests (fp32 runs realized again; bf16 and 3xTF32 runs from call 4, whose kernels
# this change does not touch), then the MiniGPT TF32 block with --profile.
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass && rm -rf .device/attruns && tar xzf .device/attruns.tgz -C .device
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache6 \
  FACT_REGISTRY=$PWD/.gpu/registry6.db RUNS=$PWD/.gpu/runs PYTHON=python3 PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
t0=$(date +%s)
FACT_TEST_ATTENTION_RUNS=$PWD/.device/attruns timeout 150 scripts/gpu_tests.sh -k "realized_attention" -s \
  > $OUT/gpu_tests_tune_attention.log 2>&1; echo "tune-attention rc=$? $(( $(date +%s) - t0 )) s"
grep -E "passed|failed|error" $OUT/gpu_tests_tune_attention.log | tail -3
grep -E "^FAILED|^ERROR" $OUT/gpu_tests_tune_attention.log | cut -c1-300 | head
grep -E "^fact_attention_f32.*_tf32:.*us" $OUT/gpu_tests_tune_attention.log | sed 's/fact_attention_//' | head -20
BENCH_FLAGS=--profile timeout $(( 380 - ($(date +%s) - t0) )) scripts/gpu_bench.sh minigpt-tf32 > $OUT/minigpt-tf32.out 2>&1; echo "minigpt-tf32 rc=$? $(( $(date +%s) - t0 )) s"
sed -n '/| module/,/^$/p' $OUT/minigpt-tf32/report.md 2>/dev/null | head -7 | cut -d'|' -f2-7
grep -E "attention\[" $OUT/minigpt-tf32/report.md | head -1 | cut -c1-300
grep -E "^\| .(fact_attention|void cutlass::device_kernel<cutlass::fmha|.anonymous namespace.::fact_norm)" $OUT/minigpt-tf32/report.md | head -4 | cut -c1-200
