#!/usr/bin/env bash
# Session 23, device call 1: the GPU tests of the composed module other than attention (new:
# a graph captured under inference_mode replayed outside it; torch.compile(backend="fact") on
# CUDA), then the GPT-2 block in bf16 (cold kernel cache, seeded registry; eager and
# torch.compile in the same run).
source scripts/device_env.sh
t0=$(date +%s)
timeout 330 scripts/gpu_tests.sh tests/python/test_compose_gpu.py -k "not attention" > "$OUT/gpu_tests_compose.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/gpu_tests_compose.log" | cut -c1-160 | tail -20
t1=$(date +%s)
timeout $(( 570 - (t1 - t0) )) scripts/gpu_bench.sh gpt2-bf16 > "$OUT/bench.log" 2>&1 || echo "gpu_bench: rc $?" >> "$OUT/bench.log"
echo "bench $(( $(date +%s) - t1 )) s"
for f in "$OUT"/*/report.md; do
  echo "== $f"; grep -A7 "^| module" "$f" | tail -n +3; grep "replaced\|End-to-end\|original model" "$f"
done > "$OUT/summary.txt"
cat "$OUT/summary.txt"; tail -3 "$OUT/bench.log"
