# Sourced by call1/run.sh (which compiles their kernels) and call2/run.sh (which benches them):
# the held-out modules no call had reached, and gemm_scale_leaky again; PROBLEMS overrides the
# list (names in bench/heldout/ or paths). Sets H and FILES.
H=bench/heldout
LIST=${PROBLEMS:-"gemm_sigmoid_gate gemm_silu_div_clamp_tanh gemm_elu_scale gemm_residual_relu
  gemm_nobias_hardswish gemm_scale_hardtanh_gelu gemm_softplus_tanh_down
  gemm_add_silu_tanh_gelu_hardtanh pointwise_three_inputs gemm_scale_leaky"}
FILES=(); for p in $LIST; do [ -f "$p" ] && FILES+=("$p") || FILES+=("$H/$p.py"); done
