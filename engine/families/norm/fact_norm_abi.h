/* FACT kernel C ABI, version 7, for generated row-norm kernels (LayerNorm, RMSNorm).
 *
 * out[r, :] = norm(x[r, :]) (* weight) (+ bias) for r < rows, each row `cols` contiguous
 * elements; rows start `ldx` / `ldout` elements apart. A statistics kernel (a LayerNorm folded
 * into the GEMMs after it) writes each row's mean to out[r] and its rstd to rstd[r] instead, both
 * f32 (`rstd` is new in version 6; a kernel of the normalised row ignores it). Status codes and fact_abi_version,
 * fact_kernel_name, fact_kernel_info and fact_last_error are those of fact_gemm_abi.h.
 */
#ifndef FACT_NORM_ABI_H
#define FACT_NORM_ABI_H

#include "fact_gemm_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct FactNormArgs {
  int64_t rows, cols;
  const void* x;      /* x[r, c] at x + r*ldx + c */
  int64_t ldx;
  const void* weight; /* [cols], or null when the norm has none */
  const void* bias;   /* [cols], or null */
  void* out;          /* out[r, c] at out + r*ldout + c */
  int64_t ldout;
  double eps;
  void* rstd;         /* statistics kernels: rstd[r] (f32); null otherwise */
  int pdl;            /* version 7: as FactGemmArgs's pdl */
} FactNormArgs;

int fact_norm_can_implement(const FactNormArgs* args);
int fact_norm_run(const FactNormArgs* args, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* FACT_NORM_ABI_H */
