// Emission for row norms (LayerNorm, RMSNorm): a plan pattern of family `norm` -> CUDA C++
// kernels that export the C ABI in abi/fact_norm_abi.h. Memory-bound, so the only tunable is the
// block width (how many vectors of a row each thread holds); no CUTLASS collective is involved.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "realize/kernel.h"

namespace fact::realize {

struct NormSpec {
  std::string kind;  // layer_norm | rms_norm
  std::string dtype_in, dtype_out, dtype_weight;  // dtype_weight "" without weight and bias
  bool has_weight = false, has_bias = false;
  bool round_before_weight = false;  // the model casts before * weight (Llama's .type_as(x))
  std::string dtype_round;           // ... to this dtype
  int64_t cols = 0;
  bool stats = false;  // write each row's mean and rstd (f32), not the normalised row

  static NormSpec from_pattern(const nlohmann::json& pattern);  // NotSupported if it cannot be
  int vector_width() const;  // elements of x per 16-byte load
  std::string id() const;
};

struct NormConfig {
  int threads = 0;  // per block (one row per block)
  int items = 0;    // vectors of a row per thread
  std::string name() const { return "t" + std::to_string(threads); }
  nlohmann::json to_json() const;
};

// Block widths worth trying for this row length (1, 2 and 4 vectors per thread, whole warps).
std::vector<NormConfig> norm_configs(const NormSpec& spec);

EmittedKernel emit_norm(const NormSpec& spec, const NormConfig& config);

// The norm ABI header generated kernels include (next to abi_header_text()'s).
const char* norm_abi_header_text();

}  // namespace fact::realize
