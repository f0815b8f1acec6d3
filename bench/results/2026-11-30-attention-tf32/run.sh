# Session 8 (2026-11-30): three device calls, run from the repository root on the H200.
# .device/ (ignored) held: cutlass.tgz (include/, tools/util/include, examples/88_hopper_fmha,
# examples/41_fused_multi_head_attention of the nvidia-cutlass wheel), bin/fact-engine (this
# revision, stripped), attruns.tgz (the attention test runs realized on the CPU machine with
#   python tests/python/test_tune_gpu.py .device/attruns  # prints the fact realize commands, run them).

# ---- .device/run_s.sh
# Session 8, device call 1: attention GPU tests (bf16 Hopper FMHA + new fp32 sm80 kernels), then
# the MiniGPT TF32 block, then the composed-attention GPU tests.
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass && tar xzf .device/attruns.tgz -C .device
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/registry.db RUNS=$PWD/.gpu/runs PYTHON=python3 PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/smi.txt
t0=$(date +%s)
FACT_TEST_ATTENTION_RUNS=$PWD/.device/attruns timeout 150 scripts/gpu_tests.sh -k "realized_attention" -s \
  > $OUT/gpu_tests_tune_attention.log 2>&1; echo "tune-attention rc=$? $(( $(date +%s) - t0 )) s"
grep -E "passed|failed|error" $OUT/gpu_tests_tune_attention.log | tail -3
grep -E "^fact_attention.*us" $OUT/gpu_tests_tune_attention.log | sed 's/fact_attention_//' | head -30
timeout 260 scripts/gpu_bench.sh minigpt-tf32 > $OUT/minigpt-tf32.out 2>&1; echo "bench rc=$? $(( $(date +%s) - t0 )) s"
sed -n '/| module/,/^$/p' $OUT/minigpt-tf32/report.md 2>/dev/null | head -8
grep -E "attention" $OUT/minigpt-tf32/report.md | tail -2 | cut -c1-400
timeout $(( 570 - ($(date +%s) - t0) )) scripts/gpu_tests.sh -k "test_compose_gpu and attention" > $OUT/gpu_tests_compose_attention.log 2>&1
echo "compose-attention rc=$? $(( $(date +%s) - t0 )) s"; tail -3 $OUT/gpu_tests_compose_attention.log

# ---- .device/run_t.sh
# Session 8, device call 2: fp32 attention tests with head-dim-96 sm80 kernels, MiniGPT TF32 and
# Llama bf16 blocks.
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass && tar xzf .device/attruns.tgz -C .device
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/registry.db RUNS=$PWD/.gpu/runs PYTHON=python3 PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
t0=$(date +%s)
FACT_TEST_ATTENTION_RUNS=$PWD/.device/attruns timeout 100 scripts/gpu_tests.sh -k "realized_attention and fp32" -s \
  > $OUT/gpu_tests_tune_attention_fp32.log 2>&1; echo "tune-attention rc=$? $(( $(date +%s) - t0 )) s"
grep -E "passed|failed|error" $OUT/gpu_tests_tune_attention_fp32.log | tail -3
grep -E "^fact_attention.*us" $OUT/gpu_tests_tune_attention_fp32.log | sed 's/fact_attention_//'
for job in minigpt-tf32 llama-bf16; do
  timeout 270 scripts/gpu_bench.sh $job > $OUT/$job.out 2>&1; echo "$job rc=$? $(( $(date +%s) - t0 )) s"
  sed -n '/| module/,/^$/p' $OUT/$job/report.md 2>/dev/null | head -7 | cut -d'|' -f2-5
  grep -E "attention" $OUT/$job/report.md | tail -1 | cut -c1-300
done

# ---- .device/run_u.sh
# Session 8, device call 3: MiniGPT fp32 (highest: 3xTF32 attention) and bf16 blocks.
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache \
  FACT_REGISTRY=$PWD/.gpu/registry.db RUNS=$PWD/.gpu/runs PYTHON=python3 PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
t0=$(date +%s)
for job in minigpt-fp32 minigpt-bf16; do
  timeout 280 scripts/gpu_bench.sh $job > $OUT/$job.out 2>&1; echo "$job rc=$? $(( $(date +%s) - t0 )) s"
  sed -n '/| module/,/^$/p' $OUT/$job/report.md 2>/dev/null | head -7 | cut -d'|' -f2-7
  grep -E "attention" $OUT/$job/report.md | tail -1 | cut -c1-300
done

# ---- .device/run_v.sh (after the review fixes; attruns realized again with this revision)
# Session 8, device call 4: the attention GPU tests after the review fixes (sm80 kernel: causal
# key bound, one-query path over a shared K/V head, 32-bit offsets), and the composed fp32 case.
set -uo pipefail
mkdir -p .gpu/cutlass && tar xzf .device/cutlass.tgz -C .gpu/cutlass && rm -rf .device/attruns && tar xzf .device/attruns.tgz -C .device
export CUTLASS_DIR=$PWD/.gpu/cutlass FACT_ENGINE=$PWD/.device/bin/fact-engine FACT_CACHE_DIR=$PWD/.gpu/cache4 \
  FACT_REGISTRY=$PWD/.gpu/registry4.db RUNS=$PWD/.gpu/runs PYTHON=python3 PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
t0=$(date +%s)
FACT_TEST_ATTENTION_RUNS=$PWD/.device/attruns timeout 200 scripts/gpu_tests.sh -k "realized_attention" -s \
  > $OUT/gpu_tests_tune_attention.log 2>&1; echo "tune-attention rc=$? $(( $(date +%s) - t0 )) s"
grep -E "passed|failed|error" $OUT/gpu_tests_tune_attention.log | tail -3
grep -E "^FAILED|^ERROR" $OUT/gpu_tests_tune_attention.log | head
timeout 200 scripts/gpu_tests.sh -k "test_compose_gpu and attention and fp32" > $OUT/gpu_tests_compose_attention_fp32.log 2>&1
echo "compose-attention-fp32 rc=$? $(( $(date +%s) - t0 )) s"; tail -2 $OUT/gpu_tests_compose_attention_fp32.log

# ---- .device/run_w.sh (.device/att32: bench/problems/attention_minigpt.py realized with
#   fact realize ... --dtype fp32 --precision high|highest --candidates 2, registry seeded from data/)
# Session 8, device call 5: issue 4's kernel benchmark at the MiniGPT shape in fp32: the sm80
# kernel (TF32 under high, 3xTF32 under highest) against fp32 SDPA, the hand-written eager module
# and torch.compile, one process per run directory (bench/gemm_bench.py).
set -uo pipefail
tar xzf .device/att32.tgz -C .device
export PYTHONPATH=$PWD/python
O=$OUT; mkdir -p $O/r; trap 'cd $O && tar czf res.tgz r && rm -rf r' EXIT; export OUT=$O/r
timeout 400 python3 bench/gemm_bench.py .device/att32 --out $OUT/att32 > $OUT/att32.log 2>&1; echo "bench rc=$?"
cat $OUT/att32/*.md 2>/dev/null | grep -E "^\|" | cut -c1-260 | head -20
