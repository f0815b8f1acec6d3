#!/usr/bin/env bash
# Session 23, device call 4 (machine still warm from call 3): call 3's einsum-bf16 job ran past
# its 150 s share while timing (its optimize had finished and its decisions were kept); the
# same job again, now warm.
source scripts/device_env.sh; timeout 215 scripts/gpu_bench.sh einsum-bf16 > "$OUT/bench-einsum-bf16.log" 2>&1; echo "rc=$?"; f=$OUT/einsum-bf16/report.md; grep -A7 "^| module" "$f" | tail -n +3; grep "replaced\|End-to-end" "$f"; grep -E "^\| [0-9]" "$f" | cut -d'|' -f2-7 | cut -c1-180; tail -3 "$OUT/bench-einsum-bf16.log"
