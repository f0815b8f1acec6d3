#!/usr/bin/env bash
# Session 15 (2026-12-01): what is left in the memory-bound kernels, and TF32 attention reading V
# keys-contiguous in place. Device calls on the H200, commands as run. Before each, on the CPU
# machine: .device/bin/fact-engine = strip of build/fact-engine; .device/cutlass.tgz is CUTLASS
# 4.2's source (the nvidia-cutlass wheel's include/, tools/util/include and examples/88_hopper_fmha,
# 41_fused_multi_head_attention, common).
#
# Call 1 (call1/): bench/v_layout_probe.py, TF32 and bf16: the fused QKV projection against
# q, k and a V^T projection, with cuBLAS:
#   bash .device/run_h15a.sh        # call1/run.sh
#
# Call 2 (call2/): bench/transpose_v_bench.cu (built on the CPU machine into
# .device/tb/transpose_bench, command in the file), and bench/norm_bench.py on the row-norm
# kernels of `fact realize` runs (examples/minigpt_block.py bf16 --candidates 2, and two
# one-norm problems: nn.LayerNorm(768) on 65536 rows in fp32, Llama's hand-written RMSNorm over
# 4096 in bf16), .device/norm/old from this session's parent commit, .device/norm/new with a
# template that put 4 or 8 rows (a warp each) in a block (t32r4, t32r8; not kept):
#   bash .device/run_h15b.sh        # call2/run.sh
#
# Call 3 (call3/): bench/attention_v_layout.py on the TF32 attention kernels of
#   FACT_REGISTRY=(empty) fact realize bench/problems/attention_minigpt.py --dtype fp32 --precision high --candidates 1
#   FACT_REGISTRY=(empty) fact realize bench/problems/attention_llama.py --dtype fp32 --precision high --candidates 1
# at this session's ABI version 4, then the attention GPU tests (these ran out of the call's
# 420 s while realizing on the GPU machine; see call4):
#   bash .device/run_h15c.sh        # call3/run.sh
#
# Call 4 (call4/): the attention GPU tests (31 passed, among them the new
# test_attention_v_with_its_keys_contiguous) on kernels realized on the CPU machine at this
# revision (FACT_TEST_ATTENTION_RUNS=.device/atr: an empty registry, and each command that
# `python tests/python/test_tune_gpu.py .device/atr` prints):
#   bash .device/run_h15d.sh        # call4/run.sh
