/* FACT kernel C ABI, version 7, for generated pointwise kernels: a region of elementwise ops
 * (with broadcasting, casts, and slices and concatenations along the last dim) in one pass.
 *
 * out[i] = f(inputs at i) for every index i of `shape`; out is contiguous in `shape`. Input j is
 * read at i through strides[j] (elements; 0 where it broadcasts), its last-dim coordinate
 * shifted by the offsets the kernel's slices and concatenations imply. The last dim of `shape`
 * is the model's last dim (the one slices and concatenations act on); the caller may reorder
 * the other dims, to follow the output's memory order. Status codes and fact_abi_version,
 * fact_kernel_name, fact_kernel_info and fact_last_error are those of fact_gemm_abi.h.
 */
#ifndef FACT_POINTWISE_ABI_H
#define FACT_POINTWISE_ABI_H

#include "fact_gemm_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FACT_POINTWISE_MAX_RANK 8
#define FACT_POINTWISE_MAX_INPUTS 16

typedef struct FactPointwiseArgs {
  int32_t rank;     /* dims of shape, 1..FACT_POINTWISE_MAX_RANK */
  int32_t n_inputs; /* must equal the kernel's */
  int64_t shape[FACT_POINTWISE_MAX_RANK];
  void* out;        /* contiguous in shape */
  const void* inputs[FACT_POINTWISE_MAX_INPUTS];
  int64_t strides[FACT_POINTWISE_MAX_INPUTS][FACT_POINTWISE_MAX_RANK];
  int32_t pdl;      /* version 7: as FactGemmArgs's pdl */
} FactPointwiseArgs;

int fact_pointwise_can_implement(const FactPointwiseArgs* args);
int fact_pointwise_run(const FactPointwiseArgs* args, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* FACT_POINTWISE_ABI_H */
