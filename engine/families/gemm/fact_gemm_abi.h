/* FACT kernel C ABI, version 7: what every generated GEMM-family kernel library exports.
 *
 * A generated .so is loaded with dlopen and driven through these symbols; no libtorch, no C++
 * types cross the boundary. Sizes and leading dimensions are in elements. Status codes:
 * FACT_OK, or one of the errors below with a message from fact_last_error().
 */
#ifndef FACT_GEMM_ABI_H
#define FACT_GEMM_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FACT_ABI_VERSION 7
#define FACT_MAX_EPILOGUE_OPERANDS 8
#define FACT_MAX_GEMM_PARTS 8

enum FactStatus {
  FACT_OK = 0,
  FACT_NOT_SUPPORTED = 1, /* the kernel cannot implement this problem (alignment, sizes) */
  FACT_INVALID_ARGS = 2,  /* a null pointer, a missing operand, a bad knob */
  FACT_CUDA_ERROR = 3,    /* a CUDA call failed; the message says which */
  FACT_WORKSPACE_TOO_SMALL = 4,
};

/* One part of a horizontally fused GEMM: D_p[m, n] = A[m, k] @ B_p[k, n] (+ bias_p[n]). B_p in
 * the kernel's B layout with its own ld; D_p row layout with its own ld; bias_p null for a part
 * without one (a kernel whose epilogue adds none ignores it). */
typedef struct FactGemmPart {
  int64_t n;
  const void* b;
  int64_t ldb;
  void* d;
  int64_t ldd;
  const void* bias;
} FactGemmPart;

/* D[l, m, n] = epilogue(sum_k A[l, m, k] * B[l, k, n], operands...) */
typedef struct FactGemmArgs {
  int64_t m, n, k, batch;
  const void* a;  /* row layout: A[m, k] at a + m*lda + k; col layout: a + k*lda + m */
  int64_t lda, batch_stride_a;
  const void* b;  /* row layout: B[k, n] at b + k*ldb + n; col layout: b + n*ldb + k */
  int64_t ldb, batch_stride_b;
  void* d;        /* always row layout: D[m, n] at d + m*ldd + n */
  int64_t ldd, batch_stride_d;
  /* Epilogue operands in the plan's order: row vectors [n], column vectors [m], scalars
   * (device pointer to one element) and full tensors [m, n] (row layout, ld in operand_ld).
   * A horizontally fused GEMM takes its biases in `parts` instead. */
  const void* operands[FACT_MAX_EPILOGUE_OPERANDS];
  int64_t operand_ld[FACT_MAX_EPILOGUE_OPERANDS];
  int64_t operand_batch_stride[FACT_MAX_EPILOGUE_OPERANDS];
  /* Run-time knobs: raster 0 heuristic, 1 along M, 2 along N; swizzle 1/2/4/8; split-K factor
   * (stream-K kernels only; 1 = none). sm_count 0 = query the device. reduction (stream-K kernels
   * only): how the CTAs sharing an output tile sum their partial accumulators; 0 deterministic
   * (one after another, in K order: the same bits every run), 1 nondeterministic (atomic adds in
   * whatever order they arrive: faster with many peers, the last bits may differ between runs).
   * decomposition (stream-K kernels only; version 5): how output tiles are shared out over the
   * persistent CTAs; 0 CUTLASS's heuristic (stream-K only when the last wave is less than half
   * full; split-K when splits > 1), 1 stream-K whenever the last wave is partial (the last two
   * waves' tiles' K iterations spread over the CTAs, the rest data-parallel; CUTLASS still runs
   * a tile of 8 K iterations or fewer data-parallel, and gives scarce stream-K work to fewer
   * CTAs), 2 data-parallel (one CTA per tile). 1 and 2 need splits 1. */
  int raster, max_swizzle, splits, sm_count, reduction, decomposition;
  /* Version 7: 1 launches the kernel as a programmatic dependent of the stream's previous kernel
   * (CUDA's programmatic dependent launch, sm_90 and later): its thread blocks may start while
   * that kernel finishes, and wait for it (its completion and its memory) before they touch
   * global memory. The same results either way. Kernels that cannot wait so launch plainly
   * whatever pdl says: horizontally fused (grouped) GEMMs, the sm80 template's GEMMs, GEMMs with
   * a scalar epilogue operand (read at kernel entry), and builds for architectures before
   * sm_90. A stream-K kernel's workspace clearing (a memset) comes between it and its
   * predecessor, so it does not overlap either. 0: a plain launch. */
  int pdl;
  /* Horizontally fused (grouped) kernels only: one GEMM per part over the shared A (m, k, a,
   * lda as above; batch 1; n is the parts' sum; b, ldb, d, ldd unused). 0 for every other
   * kernel, which refuses parts. */
  int n_parts;
  FactGemmPart parts[FACT_MAX_GEMM_PARTS];
} FactGemmArgs;

int fact_abi_version(void);
const char* fact_kernel_name(void);
/* JSON: family, dtypes, layouts, epilogue operand kinds, config. */
const char* fact_kernel_info(void);
int fact_gemm_can_implement(const FactGemmArgs* args);
size_t fact_gemm_workspace_size(const FactGemmArgs* args);
int fact_gemm_run(const FactGemmArgs* args, void* workspace, size_t workspace_bytes, void* stream);
const char* fact_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* FACT_GEMM_ABI_H */
