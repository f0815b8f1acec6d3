set -e
cd "$(git rev-parse --show-toplevel)"
T="t128x128x32_c2x1_pp_tma_sauto_persistent_tf32,t128x256x32_c2x1_coop_tmacoop_sauto_persistent_tf32,t128x256x32_c2x1_coop_tmacoop_sauto_stream_k_tf32,t256x128x32_c1x2_coop_tmacoop_sauto_stream_k_tf32"
for p in gemm_square_tn gemm_batched_tn; do
  rm -rf .device/sk/${p}_tf32
  .venv/bin/fact realize bench/problems/$p.py --dtype fp32 --precision high --configs $T --out .device/sk/${p}_tf32
done
echo DONE
