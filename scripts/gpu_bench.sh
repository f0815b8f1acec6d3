#!/usr/bin/env bash
# Stage 3 benchmarks on a GPU machine: `fact bench` (eager vs torch.compile vs FACT, one process
# per problem) for the shipped example blocks. Results and reports go to $OUT (default runs/).
#
#   scripts/gpu_bench.sh [minigpt-bf16|minigpt-tf32|minigpt-fp32|llama-bf16|llama-tf32|llama-fp32|attention ...]
#
# -tf32 jobs run fp32 models with TF32 allowed (precision high), -fp32 jobs fp32-accurate (highest).
# A job name ending in -fold runs the same job with `fact bench --fold-norms` (LayerNorms folded
# into the GEMMs after them, off by default), for the A/B of fact/folds.py: minigpt-bf16
# minigpt-bf16-fold.
#
# rope-bf16 and swiglu-bf16 bench the pointwise family alone: Llama's RoPE on Q and its SwiGLU
# product, each a one-region module (bench/problems/).
#
# Jobs named after a file of bench/zoo/ (vit-bf16, t5-fp16, bert-tf32, ...: NAME-DTYPE for
# bench/zoo/NAME_block.py) bench the blocks FACT was not developed against, the generality check.
#
# `attention` is issue 4's kernel benchmark instead: the CUTLASS FMHA candidates for the MiniGPT
# and Llama attention shapes, realized here, then verified and timed against SDPA and the
# hand-written eager attention by bench/gemm_bench.py.
#
# On a machine set up with ./setup.sh everything is found. On a bare GPU machine (no network),
# point FACT_ENGINE at a fact-engine binary and CUTLASS_DIR at CUTLASS's source tree, and make
# `python3` one with torch: the package runs from python/ without installation.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs}
RUNS=${RUNS:-$OUT}  # run directories (kernels, logs); reports are copied to $OUT/<job>/
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
ENGINE=${FACT_ENGINE:-build/fact-engine}
if [ -n "${FACT_REGISTRY:-}" ] && [ ! -f "$FACT_REGISTRY" ]; then
  "$ENGINE" registry import data/registry_seed.json
  "$PY" -m fact agent import data/lowerings.json
fi
[ $# -gt 0 ] || set -- minigpt-bf16
for job in "$@"; do
  if [ "$job" = attention ]; then
    echo "== attention: bench/realize_attention.sh + bench/gemm_bench.py"
    FACT="$PY -m fact" bench/realize_attention.sh "$RUNS/attention" 2>&1 | tee "$OUT/attention-realize.log"
    "$PY" bench/gemm_bench.py "$RUNS/attention" --out "$OUT/attention" 2>&1 | tee "$OUT/attention.log"
    continue
  fi
  flags=()
  base=$job
  if [ "${job%-fold}" != "$job" ]; then base=${job%-fold}; flags=(--fold-norms); fi
  case $base in
    minigpt-bf16) args=(examples/minigpt_block.py --dtype bf16 --precision high) ;;
    minigpt-tf32) args=(examples/minigpt_block.py --dtype fp32 --precision high) ;;
    minigpt-fp32) args=(examples/minigpt_block.py --dtype fp32 --precision highest) ;;
    llama-bf16) args=(examples/llama3_block.py --dtype bf16 --precision high) ;;
    llama-tf32) args=(examples/llama3_block.py --dtype fp32 --precision high) ;;
    llama-fp32) args=(examples/llama3_block.py --dtype fp32 --precision highest) ;;
    rope-bf16) args=(bench/problems/rope_llama.py --dtype bf16 --precision high) ;;
    swiglu-bf16) args=(bench/problems/swiglu_product.py --dtype bf16 --precision high) ;;
    *-bf16 | *-fp16 | *-tf32)
      zoo=bench/zoo/${base%-*}_block.py dtype=${base##*-} precision=high
      [ -f "$zoo" ] || { echo "unknown job $job (no $zoo)" >&2; exit 2; }
      [ "$dtype" = tf32 ] && dtype=fp32
      args=("$zoo" --dtype "$dtype" --precision "$precision") ;;
    *) echo "unknown job $job" >&2; exit 2 ;;
  esac
  echo "== $job: fact bench ${args[*]} ${flags[*]}"
  start=$(date +%s)
  mkdir -p "$OUT/$job"
  "$PY" -m fact bench "${args[@]}" "${flags[@]}" --out "$RUNS/$job" ${BENCH_FLAGS:-} 2>&1 | tee "$OUT/$job.log"
  echo "== $job: $(( $(date +%s) - start )) s wall (optimize included)" | tee -a "$OUT/$job.log"
  if [ "$RUNS" != "$OUT" ]; then
    for f in report.md report.json report.png optimize.json transcript.txt plan.json; do
      if [ -f "$RUNS/$job/$f" ]; then cp "$RUNS/$job/$f" "$OUT/$job/"; fi  # a warm run has no plan.json
    done
  fi
done
