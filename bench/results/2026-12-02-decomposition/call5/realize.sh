set -e
cd "$(git rev-parse --show-toplevel)"
B="t128x256x64_c2x1_coop_tmacoop_sauto_persistent,t128x256x64_c1x1_coop_tmacoop_sauto_persistent,t256x128x64_c1x1_coop_tmacoop_sauto_persistent,t128x256x64_c1x2_coop_tmacoop_sauto_persistent,t256x128x64_c2x1_coop_tmacoop_sauto_persistent"
.venv/bin/fact realize bench/problems/gemm_square.py --dtype bf16 --configs $B --out .device/cl/gemm_square_bf16
P="t128x128x64_c2x1_pp_tma_sauto_persistent,t128x128x64_c1x1_pp_tma_sauto_persistent,t128x128x64_c1x2_pp_tma_sauto_persistent"
.venv/bin/fact realize bench/problems/gemm_batched.py --dtype bf16 --configs $P --out .device/cl/gemm_batched_bf16
T="t128x128x32_c2x1_pp_tma_sauto_persistent_tf32,t128x128x32_c1x1_pp_tma_sauto_persistent_tf32,t128x128x32_c1x2_pp_tma_sauto_persistent_tf32"
.venv/bin/fact realize bench/problems/gemm_batched_tn.py --dtype fp32 --precision high --configs $T --out .device/cl/gemm_batched_tn_tf32
echo DONE
