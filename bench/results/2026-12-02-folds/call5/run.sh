#!/usr/bin/env bash
# Session 19, device call 5: the MiniGPT block in fp32 with TF32 allowed (cold kernel cache for
# TF32, seeded registry), eager and torch.compile in the same run.
source scripts/device_env.sh; t1=$(date +%s); timeout 250 scripts/gpu_bench.sh minigpt-tf32 > $OUT/bench.log 2>&1; echo "bench rc=$? $(( $(date +%s) - t1 )) s"; sed -n '/| module/,/^$/p' $OUT/minigpt-tf32/report.md | head -7 | cut -d'|' -f2-7; grep -E "^FACT replaced" $OUT/minigpt-tf32/report.md; grep "^| [0-9]" $OUT/minigpt-tf32/report.md | cut -d'|' -f2,3,6,7 | cut -c1-110
