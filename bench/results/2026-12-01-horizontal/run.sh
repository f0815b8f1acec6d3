#!/usr/bin/env bash
# Session 12 (2026-12-01): horizontal GEMMs as CUTLASS grouped (ptr-array) kernels; the causal
# tile order of the persistent FMHA. Device calls on the H200, commands as run. Before each, on
# the CPU machine: .device/bin/fact-engine = strip of build/fact-engine; .device/cutlass.tgz is
# CUTLASS 4.2's source (the nvidia-cutlass wheel's, with examples/88_hopper_fmha).
#
# Call 1 (call1/, run.sh there): the horizontal-GEMM GPU test (bf16: one grouped kernel for q, k,
# v; in-place weight update; CUDA graph replay), then the Llama-3 block in bf16, cold kernel
# cache, seeded registry:
#   JOBS=llama-bf16 bash .device/run_h12.sh
#
# Call 2 (call2/), after the persistent FMHA's causal tile order became heaviest-first
# (attention_sm90.cu.in: CausalHeaviestFirstScheduler): every bf16 FMHA config at the MiniGPT and
# Llama shapes, realized on the GPU machine with an empty registry (--candidates 24: all 13 that
# fit shared memory), verified and timed against SDPA in one run by bench/gemm_bench.py:
#   bash .device/run_h12b.sh        # call2/run.sh
# A first attempt of this call passed an option `fact realize` does not have (--quiet) and
# realized nothing; it also ran the horizontal GEMM GPU tests, bf16 and TF32
# (call2/gpu_tests_horizontal.log: 2 passed), which the script now runs only with WITH_TESTS=1.
#
# Call 3 (call3/): the cooperative FMHA made persistent with the same tile order, a hand edit
# of one generated kernel (kPersistent = true in the MiniGPT shape's q128kv128_coop_s5, compiled
# on the CPU machine with compile.cpp's nvcc flags), timed the same way:
#   bash .device/run_h12c.sh        # call3/run.sh; call 2's kernels were gone (a fresh machine)
#
# Call 4 (call4/), at the revision with the new prior order and the re-measured seed rows: the
# attention GPU tests (20 passed), then the MiniGPT and Llama blocks in bf16, cold kernel cache,
# seeded registry:
#   bash .device/run_h12d.sh        # call4/run.sh
#
# Call 5 (call5/): every TF32 FMHA config at the MiniGPT shape (fp32, precision high) after the
# new tile order, the same way as call 2: ping-pong 0.480 ms (0.650 in the seed rows before),
# the cooperative kernel still first at 0.464:
#   bash .device/run_h12e.sh        # call5/run.sh
#
# Call 6 (call6/), at the review fixes (the grouped kernel's size checks, the shared grid
# fragment, plain kernels refusing parts): the horizontal GEMM GPU tests, bf16 and TF32
# (2 passed):
#   bash .device/run_h12f.sh        # call6/run.sh
#
# Call 7 (call7/), an experiment not kept: the causal order in groups of one (batch, head) pair
# a CTA (each CTA doing all query tiles of its pair, heaviest first, so the pairs in flight keep
# K/V in L2), the MiniGPT shape's ping-pong kernel realized on the CPU machine from that
# template: 0.1937 ms against SDPA's 0.1923 in the same run (1.007x its time; call 2's order
# 1.021x). Within the noise between runs, so the simpler order of call 2 stays.
#   bash .device/run_h12g.sh        # call7/run.sh
