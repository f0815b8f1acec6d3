#include "ir/ops.h"

#include <unordered_map>
#include <vector>

#include "ir/error.h"

namespace fact::ir {
namespace {

using C = OpClass;

// One row per canonical op. The ATen base names that map to it follow in kAliases.
const std::vector<OpInfo>& table() {
  static const std::vector<OpInfo> rows = {
      {Op::placeholder, "placeholder", C::placeholder},
      {Op::getitem, "getitem", C::view},
      {Op::opaque, "opaque", C::opaque},
      {Op::mm, "mm", C::gemm},
      {Op::addmm, "addmm", C::gemm},
      {Op::bmm, "bmm", C::gemm},
      {Op::baddbmm, "baddbmm", C::gemm},
      {Op::matmul, "matmul", C::gemm},
      {Op::linear, "linear", C::gemm},
      {Op::relu, "relu", C::pointwise},
      {Op::leaky_relu, "leaky_relu", C::pointwise},
      {Op::sigmoid, "sigmoid", C::pointwise},
      {Op::tanh, "tanh", C::pointwise},
      {Op::gelu, "gelu", C::pointwise},
      {Op::silu, "silu", C::pointwise},
      {Op::mish, "mish", C::pointwise},
      {Op::hardtanh, "hardtanh", C::pointwise},
      {Op::clamp, "clamp", C::pointwise},
      {Op::clamp_min, "clamp_min", C::pointwise},
      {Op::clamp_max, "clamp_max", C::pointwise},
      {Op::neg, "neg", C::pointwise},
      {Op::exp, "exp", C::pointwise},
      {Op::log, "log", C::pointwise},
      {Op::log1p, "log1p", C::pointwise},
      {Op::expm1, "expm1", C::pointwise},
      {Op::sqrt, "sqrt", C::pointwise},
      {Op::rsqrt, "rsqrt", C::pointwise},
      {Op::reciprocal, "reciprocal", C::pointwise},
      {Op::abs, "abs", C::pointwise},
      {Op::erf, "erf", C::pointwise},
      {Op::softplus, "softplus", C::pointwise},
      {Op::elu, "elu", C::pointwise},
      {Op::hardswish, "hardswish", C::pointwise},
      {Op::hardsigmoid, "hardsigmoid", C::pointwise},
      {Op::sin, "sin", C::pointwise},
      {Op::cos, "cos", C::pointwise},
      {Op::square, "square", C::pointwise},
      {Op::pow, "pow", C::pointwise},
      {Op::lowered, "lowered", C::pointwise},
      {Op::add, "add", C::pointwise},
      {Op::sub, "sub", C::pointwise},
      {Op::rsub, "rsub", C::pointwise},
      {Op::mul, "mul", C::pointwise},
      {Op::div, "div", C::pointwise},
      {Op::minimum, "minimum", C::pointwise},
      {Op::maximum, "maximum", C::pointwise},
      {Op::where, "where", C::pointwise},
      {Op::masked_fill, "masked_fill", C::pointwise},
      {Op::eq, "eq", C::pointwise},
      {Op::ne, "ne", C::pointwise},
      {Op::lt, "lt", C::pointwise},
      {Op::le, "le", C::pointwise},
      {Op::gt, "gt", C::pointwise},
      {Op::ge, "ge", C::pointwise},
      {Op::logical_not, "logical_not", C::pointwise},
      {Op::to_dtype, "to", C::cast},
      {Op::type_as, "type_as", C::cast},
      {Op::dropout, "dropout", C::identity},
      {Op::alias, "alias", C::identity},
      {Op::detach, "detach", C::identity},
      {Op::clone, "clone", C::identity},
      {Op::lift_fresh_copy, "lift_fresh_copy", C::identity},
      {Op::view, "view", C::view},
      {Op::reshape, "reshape", C::view},
      {Op::unsafe_view, "_unsafe_view", C::view},
      {Op::view_as, "view_as", C::view},
      {Op::reshape_as, "reshape_as", C::view},
      {Op::permute, "permute", C::view},
      {Op::transpose, "transpose", C::view},
      {Op::t, "t", C::view},
      {Op::mT, "mT", C::view},          // transpose(-2, -1)
      {Op::numpy_T, "numpy_T", C::view},  // x.T: all dims reversed
      {Op::unsqueeze, "unsqueeze", C::view},
      {Op::squeeze, "squeeze", C::view},
      {Op::expand, "expand", C::view},
      {Op::expand_as, "expand_as", C::view},
      {Op::slice, "slice", C::view},
      {Op::select, "select", C::view},
      {Op::split, "split", C::view},
      {Op::split_with_sizes, "split_with_sizes", C::view},
      {Op::chunk, "chunk", C::view},
      {Op::unbind, "unbind", C::view},
      {Op::flatten, "flatten", C::view},
      {Op::unflatten, "unflatten", C::view},
      {Op::narrow, "narrow", C::view},
      {Op::contiguous, "contiguous", C::copy},
      {Op::cat, "cat", C::copy},
      {Op::stack, "stack", C::copy},
      {Op::repeat_interleave, "repeat_interleave", C::copy},
      {Op::repeat, "repeat", C::copy},
      {Op::sum, "sum", C::reduction},
      {Op::mean, "mean", C::reduction},
      {Op::amax, "amax", C::reduction},
      {Op::amin, "amin", C::reduction},
      {Op::var, "var", C::reduction},
      {Op::softmax, "softmax", C::softmax},
      {Op::log_softmax, "log_softmax", C::softmax},
      {Op::layer_norm, "layer_norm", C::norm},
      {Op::native_layer_norm, "native_layer_norm", C::norm},
      {Op::rms_norm, "rms_norm", C::norm},
      {Op::group_norm, "group_norm", C::norm},
      {Op::sdpa, "scaled_dot_product_attention", C::attention},
      {Op::sdpa_flash, "_scaled_dot_product_flash_attention", C::attention},
      {Op::sdpa_efficient, "_scaled_dot_product_efficient_attention", C::attention},
      {Op::sdpa_cudnn, "_scaled_dot_product_cudnn_attention", C::attention},
      {Op::full, "full", C::creation},
      {Op::ones, "ones", C::creation},
      {Op::zeros, "zeros", C::creation},
      {Op::arange, "arange", C::creation},
      {Op::triu, "triu", C::creation},
      {Op::tril, "tril", C::creation},
      {Op::full_like, "full_like", C::creation},
      {Op::ones_like, "ones_like", C::creation},
      {Op::zeros_like, "zeros_like", C::creation},
      {Op::assert_metadata, "_assert_tensor_metadata", C::meta},
      {Op::sym_size, "sym_size", C::meta},
  };
  return rows;
}

// ATen base names that are spelt differently from the canonical name.
const std::unordered_map<std::string, Op>& aliases() {
  static const std::unordered_map<std::string, Op> extra = {
      {"_to_copy", Op::to_dtype},   {"_softmax", Op::softmax},     {"_log_softmax", Op::log_softmax},
      {"true_divide", Op::div},     {"multiply", Op::mul},         {"subtract", Op::sub},
      {"clip", Op::clamp},          {"special_erf", Op::erf},      {"_unsafe_view", Op::unsafe_view},
      {"view_copy", Op::view},      {"permute_copy", Op::permute}, {"expand_copy", Op::expand},
      {"slice_copy", Op::slice},    {"transpose_copy", Op::transpose},
      {"unsqueeze_copy", Op::unsqueeze}, {"alias_copy", Op::alias},
      {"_assert_scalar", Op::assert_metadata}, {"scalar_tensor", Op::full},
      {"detach_", Op::detach},  // torch.tensor(c) in a forward: lift_fresh_copy, then detach_
  };
  return extra;
}

}  // namespace

const OpInfo& op_info(Op op) {
  const auto& rows = table();
  for (const auto& row : rows) {
    if (row.op == op) return row;
  }
  FACT_CHECK(false, "op missing from the vocabulary table");
}

const char* op_class_name(OpClass c) {
  switch (c) {
    case C::placeholder: return "placeholder";
    case C::gemm: return "gemm";
    case C::pointwise: return "pointwise";
    case C::cast: return "cast";
    case C::identity: return "identity";
    case C::view: return "view";
    case C::copy: return "copy";
    case C::reduction: return "reduction";
    case C::softmax: return "softmax";
    case C::norm: return "norm";
    case C::attention: return "attention";
    case C::creation: return "creation";
    case C::meta: return "meta";
    case C::opaque: return "opaque";
  }
  return "?";
}

namespace {

// The canonical op of an ATen base name ("add", "_to_copy"); Op::opaque when unknown.
Op op_of_base(const std::string& base) {
  static const std::unordered_map<std::string, Op> by_name = [] {
    std::unordered_map<std::string, Op> m;
    for (const auto& row : table()) m.emplace(std::string(row.name), row.op);
    for (const auto& [k, v] : aliases()) m.emplace(k, v);
    m.erase("placeholder");
    m.erase("getitem");
    m.erase("opaque");
    return m;
  }();
  auto it = by_name.find(base);
  return it == by_name.end() ? Op::opaque : it->second;
}

// The pointwise op whose in-place form `base` is ("mul_" -> mul); Op::opaque otherwise.
Op in_place_op(const std::string& base) {
  if (base.size() < 2 || base.back() != '_' || base.front() == '_') return Op::opaque;
  const Op op = op_of_base(base.substr(0, base.size() - 1));
  return op_class(op) == OpClass::pointwise ? op : Op::opaque;
}

}  // namespace

Op op_from_target(const std::string& target) {
  if (target == "placeholder") return Op::placeholder;
  if (target == "getitem") return Op::getitem;
  const std::string base = aten_base(target);  // Python callables and other namespaces: opaque
  if (base.empty()) return Op::opaque;
  const Op op = op_of_base(base);
  return op != Op::opaque ? op : in_place_op(base);
}

std::string aten_base(const std::string& target) {
  if (target.rfind("aten.", 0) != 0) return "";
  const auto rest = target.substr(5);
  return rest.substr(0, rest.find('.'));
}

bool in_place_target(const std::string& target) { return in_place_op(aten_base(target)) != Op::opaque; }

}  // namespace fact::ir
