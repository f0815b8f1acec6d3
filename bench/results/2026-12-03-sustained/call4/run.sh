#!/usr/bin/env bash
# Device call 4 (twenty-sixth session): the ViT block (nn.MultiheadAttention's exported graph,
# whose attention failed at composition on the H200 before the walk stopped at copying
# contiguous() calls; not run on the GPU since) and the Llama block at this commit.
set -uo pipefail
source scripts/device_env.sh
t0=$(date +%s)
timeout 200 scripts/gpu_bench.sh vit-bf16 > "$OUT/bench_vit.log" 2>&1
echo "vit rc=$? $(( $(date +%s) - t0 )) s"
timeout 240 scripts/gpu_bench.sh llama-bf16 > "$OUT/bench_llama.log" 2>&1
echo "llama rc=$? $(( $(date +%s) - t0 )) s"
for j in vit-bf16 llama-bf16; do
  sed -n '/^| module/,/^$/p;/^FACT replaced/p;/^\*\*The module runs/p' "$OUT/$j/report.md"
  grep -E "^\| [0-9]+ \| \`attention" "$OUT/$j/report.md" | cut -c1-260
done
