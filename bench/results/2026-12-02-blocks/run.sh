#!/usr/bin/env bash
# Session 16 (2026-12-01/02): the MiniGPT block in fp32 with TF32 allowed, measured for the first
# time with fact.layouts' V^T rewrite, and again after the attention tuner learnt to time the V
# that runs; the MiniGPT block in bf16; the composed attention GPU tests. Device calls on the
# H200, commands as run (each callN/run.sh). Before each, on the CPU machine:
# .device/bin/fact-engine = strip of build/fact-engine at the revision described;
# .device/cutlass.tgz = CUTLASS 4.2's include/, tools/util/include, examples/88_hopper_fmha,
# 41_fused_multi_head_attention, common (from the nvidia-cutlass wheel).
#
# Call 1 (call1/): scripts/gpu_bench.sh minigpt-tf32 at f1faf58 (the fifteenth session's last
# commit), then the composed attention GPU tests (they ran out of the call's time after 8
# passed, with tests/python collected as well as the file: scripts/gpu_tests.sh now runs only
# the files it is given):
#   bash .device/run_h16a.sh        # call1/run.sh
# Call 2 (call2/): the composed attention GPU tests by name (6 passed), then
# scripts/gpu_bench.sh minigpt-bf16:
#   bash .device/run_h16b.sh        # call2/run.sh
# Call 3 (call3/): with the tuner making V keys-contiguous as the plan lays it out: the
# composed TF32 attention GPU tests (2 passed), scripts/gpu_bench.sh minigpt-tf32 (the
# attention rows still came from the registry: one signature for both V layouts):
#   bash .device/run_h16c.sh        # call3/run.sh
# Call 4 (call4/): with the `:v_keys` signature: scripts/gpu_bench.sh minigpt-tf32, the
# attention configs tuned on the V that runs; the registry's new rows exported
# (registry_v_keys_rows.json, now in data/registry_seed.json):
#   bash .device/run_h16d.sh        # call4/run.sh
