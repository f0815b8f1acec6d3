// Emission for pointwise regions (families/pointwise/rule_pointwise.cpp): a plan pattern of family
// `pointwise` -> one CUDA C++ kernel per block shape, exporting the C ABI in
// abi/fact_pointwise_abi.h. Memory-bound: each thread computes 2 or 4 16-byte vectors of the
// last dim, a block apart; no CUTLASS collective is involved.
//
// The expression is the pattern's SSA over its operands (see discover/expr.h) plus two index
// functions of the last dim: slice_last [start, length] reads its argument at coordinate
// c + start, and cat_last [size0, size1, ...] reads argument i at c - (size0 + ... + size(i-1))
// for c in its range. They are compiled by shifting operand loads, so a region never
// materialises a slice or a concatenation; a concatenation is a branch that is uniform across
// a thread's vector (the vector width divides every boundary).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "realize/kernel.h"

namespace fact::realize {

struct PointwiseSpec {
  nlohmann::json ssa;                // the expression (epilogue_expr.ssa)
  std::vector<std::string> inputs;   // dtype per operand: bf16 | f16 | f32 | bool
  // How each operand's last dim is read: contiguous (one vector load; the kernel refuses other
  // strides), broadcast (one value), or strided (any stride, decided at run time)
  std::vector<std::string> access;
  std::string dtype_out;             // bf16 | f16 | f32
  int64_t cols = 0;                  // the last dim
  int rank = 0;                      // of the output, as traced
  int vec = 1;                       // elements per thread: 16 bytes of output, dividing every boundary

  static PointwiseSpec from_pattern(const nlohmann::json& pattern);  // NotSupported if it cannot be
  std::string id() const;
};

struct PointwiseConfig {
  int threads = 256;  // per block
  int items = 1;      // vectors per thread, `threads` apart
  std::string name() const { return "t" + std::to_string(threads) + "i" + std::to_string(items); }
  nlohmann::json to_json() const { return {{"name", name()}, {"threads", threads}, {"items", items}}; }
};

std::vector<PointwiseConfig> pointwise_configs(const PointwiseSpec& spec);
// The block shapes of a GEMM epilogue's tail kernel (emit.h, gemm_epilogue_tail).
std::vector<PointwiseConfig> tail_configs(const PointwiseSpec& spec);

EmittedKernel emit_pointwise(const PointwiseSpec& spec, const PointwiseConfig& config);

// The pointwise ABI header generated kernels include (next to abi_header_text()'s).
const char* pointwise_abi_header_text();

}  // namespace fact::realize
