#!/usr/bin/env bash
# Session 13 (2026-12-01): the FMHA's overlapped mainloop (each warp group's softmax overlapping
# its own P @ V) and the persistent kernel's second tile of Q stages. Device calls on the H200,
# commands as run. Before each, on the CPU machine: .device/bin/fact-engine = strip of
# build/fact-engine; .device/cutlass.tgz is CUTLASS 4.2's source (the nvidia-cutlass wheel's
# include/, tools/util/include and examples/88_hopper_fmha, 41_fused_multi_head_attention, common).
#
# Call 1 (call1/): every bf16 FMHA config at the MiniGPT and Llama shapes with the overlapped
# mainloop as a new knob (an empty registry, --candidates 30), realized on the GPU machine,
# verified and timed against SDPA by bench/gemm_bench.py. The 6 cooperative overlapped configs
# per shape failed to compile (an unsigned tile coordinate, fixed before call 2):
#   bash .device/run_h13a.sh        # call1/run.sh
#
# Call 2 (call2/): named configs (fact realize --configs, new) with the second Q stages (_q4) and
# the fixed cooperative form, bf16 at both shapes and TF32 at the MiniGPT shape:
#   bash .device/run_h13b.sh        # call2/run.sh
#
# Call 3 (call3/): the attention GPU tests at the revision with the new prior order (28 passed):
#   bash .device/run_h13c.sh        # call3/run.sh
#
# Call 4 (call4/), at the final revision: the MiniGPT block in bf16, cold kernel cache, seeded
# registry. FACT 1.788 ms, torch.compile 2.649, eager 6.304; the attention pattern's FMHA (the
# overlapped mainloop with the second Q) tied SDPA in context (0.190 ms each), SDPA kept:
#   bash .device/run_h13d.sh        # call4/run.sh
