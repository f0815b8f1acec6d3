# Hand-edited copies of generated kernels: the epilogue subtile fixed instead of EpilogueTileAuto
# (128x32 for cooperative kernels). An experiment, not FACT output.
set -e
cd "$(git rev-parse --show-toplevel)"
C=.venv/lib/python3.11/site-packages/cutlass_library/source
out=.device/epi
build() {  # src epi_n name
  sed "s/cutlass::epilogue::collective::EpilogueTileAuto/Shape<_128, _$2>/" $1 > $out/$3.cu
  grep -q "Shape<_128, _$2>, ElementAccumulator" $out/$3.cu
  nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a -Xcompiler=-fPIC \
    -Xcompiler=-fvisibility=hidden -shared -lineinfo -I$C/include -I$C/tools/util/include -Iengine/realize/abi \
    -o $out/$3.so $out/$3.cu > $out/$3.log 2>&1 && echo "built $3" || { echo "FAILED $3"; tail -5 $out/$3.log; }
}
S=.device/sk/gemm_square_bf16/src
T=.device/sk/gemm_square_tn_tf32/src
build $S/fact_gemm_bf16_rr_46c58dc054_t128x256x64_c2x1_coop_tmacoop_sauto_persistent.cu 64 bf16_t128x256_epi64 &
build $S/fact_gemm_bf16_rr_46c58dc054_t128x256x64_c2x1_coop_tmacoop_sauto_persistent.cu 128 bf16_t128x256_epi128
wait
build $S/fact_gemm_bf16_rr_46c58dc054_t256x128x64_c1x2_coop_tmacoop_sauto_persistent.cu 64 bf16_t256x128_epi64 &
build $T/fact_gemm_f32_rc_b11474f177_t128x256x32_c2x1_coop_tmacoop_sauto_persistent_tf32.cu 64 tf32_t128x256_epi64
wait
echo DONE
