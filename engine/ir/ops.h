// The op vocabulary: canonical ops the rules reason about, grouped by what they do to data.
//
// An ATen overload maps to a canonical op by its base name ("aten.add.Tensor" -> Op::add).
// Anything else is Op::opaque: it stays in the graph and runs in PyTorch.
#pragma once

#include <string>
#include <string_view>

namespace fact::ir {

enum class OpClass {
  placeholder,  // graph inputs, parameters, buffers, constants
  gemm,         // mm, addmm, bmm, baddbmm, matmul, linear
  pointwise,    // elementwise math, broadcasting operands
  cast,         // dtype conversion (elementwise, no math)
  identity,     // returns its input (dropout in eval, alias, detach, clone)
  view,         // changes shape/strides, no data moved (view, permute, slice, expand, ...)
  copy,         // moves data without math (contiguous of a strided view, cat)
  reduction,    // sum, mean, amax, ...
  softmax,      // softmax, log_softmax
  norm,         // layer_norm, rms_norm, group_norm
  attention,    // scaled_dot_product_attention and its backends
  creation,     // full, ones, arange, triu/tril masks
  meta,         // assertions and size queries: no kernel, no data
  opaque,       // unknown to the catalog: runs in PyTorch
};

enum class Op {
  placeholder, getitem, opaque,
  // gemm
  mm, addmm, bmm, baddbmm, matmul, linear,
  // pointwise unary
  relu, leaky_relu, sigmoid, tanh, gelu, silu, mish, hardtanh, clamp, clamp_min, clamp_max,
  neg, exp, log, log1p, expm1, sqrt, rsqrt, reciprocal, abs, erf, softplus, elu, hardswish, hardsigmoid,
  sin, cos, square, pow,
  lowered,  // an op the catalog lacks, given an expression as data (discover/lowering.h)
  // pointwise binary / ternary
  add, sub, rsub, mul, div, minimum, maximum, where, masked_fill,
  eq, ne, lt, le, gt, ge, logical_not,
  // cast and identity
  to_dtype, type_as, dropout, alias, detach, clone, lift_fresh_copy,
  // views and copies
  view, reshape, unsafe_view, view_as, reshape_as, permute, transpose, t, mT, numpy_T, unsqueeze, squeeze, expand, expand_as, slice, select,
  split, split_with_sizes, chunk, unbind, flatten, unflatten, narrow, contiguous, cat, stack,
  repeat_interleave, repeat,
  // reductions and friends
  sum, mean, amax, amin, var, softmax, log_softmax,
  layer_norm, native_layer_norm, rms_norm, group_norm,
  sdpa, sdpa_flash, sdpa_efficient, sdpa_cudnn,
  full, ones, zeros, arange, triu, tril, full_like, ones_like, zeros_like,
  assert_metadata, sym_size,
};

struct OpInfo {
  Op op;
  std::string_view name;  // canonical name, used in reports and as an epilogue step name
  OpClass cls;
};

const OpInfo& op_info(Op op);
const char* op_class_name(OpClass c);
// "aten.add.Tensor" -> Op::add; "getitem" -> Op::getitem; unknown -> Op::opaque. The in-place
// form of a pointwise op ("aten.add_.Tensor") maps to the op itself: Graph::finalize keeps that
// reading only where nothing can observe the write (see in_place_target).
Op op_from_target(const std::string& target);
// Whether `target` is the in-place form of a pointwise op ("aten.mul_.Tensor").
bool in_place_target(const std::string& target);
// "aten.add.Tensor" -> "add"; "aten.relu_.default" -> "relu_"; "" for anything not ATen.
std::string aten_base(const std::string& target);
inline std::string_view op_name(Op op) { return op_info(op).name; }
inline OpClass op_class(Op op) { return op_info(op).cls; }

}  // namespace fact::ir
