set -e
cd "$(git rev-parse --show-toplevel)"
B="t128x256x64_c2x1_coop_tmacoop_sauto_persistent,t128x256x64_c2x1_coop_tmacoop_sauto_stream_k,t256x128x64_c1x2_coop_tmacoop_sauto_persistent,t256x128x64_c1x2_coop_tmacoop_sauto_stream_k,t128x128x64_c2x1_pp_tma_sauto_persistent"
T="t128x128x32_c2x1_pp_tma_sauto_persistent,t128x256x32_c2x1_coop_tmacoop_sauto_persistent,t128x256x32_c2x1_coop_tmacoop_sauto_stream_k,t256x128x32_c1x2_coop_tmacoop_sauto_stream_k"
for p in gemm_square gemm_batched; do
  .venv/bin/fact realize bench/problems/$p.py --dtype bf16 --configs $B --out .device/sk/${p}_bf16
done
for p in gemm_square_tn gemm_batched_tn; do
  .venv/bin/fact realize bench/problems/$p.py --dtype fp32 --precision high --configs $T --out .device/sk/${p}_tf32
done
echo DONE
