#!/usr/bin/env bash
# Session 23, device call 2 (machine still warm from call 1, kernel cache kept): the backend
# test again (call 1's failed: on a source tree without the package installed, backend="fact"
# needs `import fact.backend`, which the test now does) and the compose GPU tests call 1's
# timeout cut off; then the GPT-2 block with right padding in bf16 (score bias under a causal
# mask, one attn_mask for SDPA).
source scripts/device_env.sh
t0=$(date +%s)
timeout 330 scripts/gpu_tests.sh tests/python/test_compose_gpu.py -k "backend or (folded and dtype1) or dependent or pointwise or rope" > "$OUT/gpu_tests_compose.log" 2>&1
echo "tests rc=$? $(( $(date +%s) - t0 )) s"
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|^E  " "$OUT/gpu_tests_compose.log" | cut -c1-200 | tail -24
t1=$(date +%s)
timeout $(( 570 - (t1 - t0) )) scripts/gpu_bench.sh gpt2_padded-bf16 > "$OUT/bench.log" 2>&1 || echo "gpu_bench: rc $?" >> "$OUT/bench.log"
echo "bench $(( $(date +%s) - t1 )) s"
for f in "$OUT"/*/report.md; do
  echo "== $f"; grep -A7 "^| module" "$f" | tail -n +3; grep "replaced\|End-to-end\|original model" "$f"
done > "$OUT/summary.txt"
cat "$OUT/summary.txt"; tail -3 "$OUT/bench.log"
