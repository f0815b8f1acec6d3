/* FACT kernel C ABI, version 7 (this header unchanged since 4), for generated fused attention
 * kernels (forward).
 *
 * O[b, h, s, :] = softmax(scale * Q[b, h, s, :] . K[b, hk, t, :] (+ causal mask)) @ V[b, hk, t, :]
 * for b < batch, h < heads, s < seq_q, t < seq_k, where hk = h / (heads / kv_heads) (grouped-query
 * attention: consecutive query heads share a key/value head, as in repeat_interleave). Every
 * tensor is addressed through its own element strides (the last dim is contiguous), so Q, K and V
 * can be read in place from a fused QKV projection and O written in (batch, seq, heads*dim).
 * V alone may instead have its keys contiguous (v_stride_s == 1, v_stride_d its head-dim stride),
 * as a projection that writes V^T leaves it: kernels whose MMAs read V keys-contiguous (TF32 on
 * Hopper, fact_kernel_info's "v_keys_contiguous") then read it in place instead of transposing
 * it; the others refuse it (FACT_NOT_SUPPORTED).
 * Version 4 added v_stride_d.
 * The causal mask is top-left aligned (query s sees keys t <= s), as PyTorch's is_causal.
 * Status codes and fact_abi_version, fact_kernel_name, fact_kernel_info and fact_last_error are
 * those of fact_gemm_abi.h.
 */
#ifndef FACT_ATTENTION_ABI_H
#define FACT_ATTENTION_ABI_H

#include "fact_gemm_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct FactAttentionArgs {
  int64_t batch, heads, kv_heads, seq_q, seq_k, head_dim;
  const void* q; /* Q[b, h, s, d] at q + b*q_stride_b + h*q_stride_h + s*q_stride_s + d */
  int64_t q_stride_b, q_stride_h, q_stride_s;
  const void* k; /* K[b, hk, t, d], strides likewise */
  int64_t k_stride_b, k_stride_h, k_stride_s;
  const void* v; /* V[b, hk, t, d] */
  int64_t v_stride_b, v_stride_h, v_stride_s;
  void* o;       /* O[b, h, s, d] */
  int64_t o_stride_b, o_stride_h, o_stride_s;
  float scale;   /* softmax scale; 1/sqrt(head_dim) in most models */
  int sm_count;  /* 0 = query the device */
  int64_t v_stride_d; /* V's head-dim stride: 0 or 1 = contiguous; otherwise keys contiguous */
} FactAttentionArgs;

int fact_attention_can_implement(const FactAttentionArgs* args);
/* Scratch the kernel needs, 16-byte aligned: the rows' log-sum-exp (float per (batch, head,
 * query)) and, for a TF32 Hopper kernel given V with a contiguous head dim, a transposed copy of
 * V (its size). */
size_t fact_attention_workspace_size(const FactAttentionArgs* args);
int fact_attention_run(const FactAttentionArgs* args, void* workspace, size_t workspace_bytes, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* FACT_ATTENTION_ABI_H */
