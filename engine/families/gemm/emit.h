// Emission: a GEMM-family pattern (as the plan describes it) plus a GemmConfig -> one CUDA C++
// source, built for sm_90a, that exports the C ABI in abi/fact_gemm_abi.h.
//
// The pattern's epilogue expression becomes one compute node over fragments at the root of an
// epilogue visitor tree whose leaves fetch the accumulator and the operands (row and column
// broadcasts, scalars, one full tensor through C). Substitution into the template is strict:
// an unknown or leftover ${placeholder} is an internal error.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "families/gemm/config.h"
#include "realize/kernel.h"

namespace fact::realize {

struct EpilogueOperand {
  std::string kind;   // row | col | scalar | full
  std::string dtype;  // bf16 | f16 | f32
  std::string node;   // graph node it reads, for reports
};

// What a GEMM kernel computes, independent of the graph: read from one plan pattern.
struct GemmSpec {
  std::string family;  // gemm | horizontal_gemm
  std::string dtype_a, dtype_b, dtype_out;
  std::string layout_a, layout_b;  // row | col
  nlohmann::json ssa;              // epilogue expression (see discover/expr.h)
  std::string epilogue_text;
  std::vector<EpilogueOperand> operands;

  static GemmSpec from_pattern(const nlohmann::json& pattern);  // NotSupported if it cannot be
  std::string id() const;  // short stable hash of everything but the config
};

// The kernel of `config`: emit_gemm_grouped_sm90 for a horizontal GEMM, emit_gemm_sm80 for a
// multistage config, else emit_gemm_sm90.
EmittedKernel emit_gemm(const GemmSpec& spec, const GemmConfig& config);
EmittedKernel emit_gemm_sm90(const GemmSpec& spec, const GemmConfig& config);
// CUTLASS 2.x sm80 GEMM, cp.async multistage + mma.sync, with an sm80 epilogue visitor tree (the
// same operand kinds; a full operand is an aux load). For f32 operands in 3xTF32 (the
// fp32-accurate GEMMs under precision "highest"); runs on sm80 and later, sm90 included.
EmittedKernel emit_gemm_sm80(const GemmSpec& spec, const GemmConfig& config);
// A horizontally fused GEMM (family horizontal_gemm): CUTLASS 3's sm90 grouped (ptr-array)
// kernel, one persistent grid over every part's tiles; the parts share A and keep their own B
// (the model's weights, in place), D and bias, passed in FactGemmArgs.parts. Group tile
// scheduler only; no 3xTF32 form.
EmittedKernel emit_gemm_grouped_sm90(const GemmSpec& spec, const GemmConfig& config);

// A gated MLP, act(x @ W_gate^T) * (x @ W_up^T), as one GEMM pattern with a fused epilogue:
// the up projection stays a plain GEMM (PyTorch's) and the gate GEMM's epilogue computes
// act(acc) * up, reading `up` as a full operand. Returns the plan pattern of that GEMM
// (family gemm, rule gated_mlp_lowered, an "up" operand naming the up projection's node);
// NotSupported for activations the epilogue vocabulary lacks or a batched problem.
nlohmann::json lower_gated_mlp(const nlohmann::json& pattern);

// The other way to run a gated MLP: both projections as library GEMMs, then act(gate) * up in
// one generated pointwise kernel. From the lowered pattern (above), returns the plan pattern of
// that kernel (family pointwise, rule gated_mlp_tail; operands in0 = the gate projection's
// output, in1 = the up projection's, both contiguous [.., n]).
nlohmann::json gated_mlp_tail(const nlohmann::json& lowered);

// The other way to run a GEMM pattern with an epilogue: the plain product as a library GEMM
// (cuBLAS through PyTorch, strong where no generated config is, such as small M with large N
// and K), then the whole epilogue in one generated pointwise kernel. Returns the plan pattern of
// that kernel (family pointwise, rule gemm_epilogue_tail; in0 = the product, shaped as the
// output `out_shape`, in `acc_dtype`; then the epilogue operands in order, a row as [n], a
// column as [.., 1], a scalar as [1], a full operand as the output); NotSupported without an
// epilogue or for a function pointwise kernels lack.
nlohmann::json gemm_epilogue_tail(const nlohmann::json& pattern, const std::vector<int64_t>& out_shape,
                                  const std::string& acc_dtype);


}  // namespace fact::realize
