// What every kernel family's emitter shares: the kernel it returns, the refusal it throws, the
// template substitution, dtype names and the ABI pieces every generated library carries.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fact::realize {

// A pattern FACT cannot (yet) turn into a kernel; the reason goes into the results table.
struct NotSupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --configs named none of a pattern's usable configs: throws NotSupported listing each name
// with the reason its config was dropped (`dropped`: name and reason, in filter order), or as not
// in the pattern's configuration space.
[[noreturn]] void refuse_named(const std::set<std::string>& names,
                               const std::vector<std::pair<std::string, std::string>>& dropped);

struct EmittedKernel {
  std::string name;    // fact_<family>_..._<spec id>_<config name>
  std::string source;  // the .cu text
};

// Expressions of more steps than this get no kernel (NotSupported): the emitters walk them
// recursively, and a kernel that long would spill its registers anyway.
constexpr size_t kMaxExpressionSteps = 1024;
void check_expression_size(const nlohmann::json& ssa);

// ${name} substitution; throws InternalError on a missing variable or a leftover placeholder.
std::string substitute(const std::string& text, const std::map<std::string, std::string>& vars);

// The CUTLASS element type of a plan dtype (bf16, f16, f32); NotSupported for others.
std::string cutlass_element(const std::string& dtype);

// The CUDA type of a plan dtype in the hand-written kernel families (row norms, pointwise):
// bf16, f16, f32, and bool where `with_bool`; NotSupported naming `family` for others.
std::string cuda_type(const std::string& dtype, const std::string& family, bool with_bool = false);
// Bytes per element of those dtypes.
int dtype_size(const std::string& dtype);
// The shape in a plan operand's type, "bf16[4, 2048, 128]" -> {4, 2048, 128}; NotSupported if
// it has none.
std::vector<int64_t> type_shape(const std::string& type);

// 10 hex digits of a stable (FNV-1a) hash: the spec part of kernel names.
std::string short_hash(const std::string& text);

// The ABI header every generated kernel includes (written beside the sources).
const char* abi_header_text();
// The four exports every kernel library has (fact_abi_version, fact_kernel_name,
// fact_kernel_info, fact_last_error: templates/abi_exports.cu.in), for `name` and its info JSON.
std::string abi_exports(const std::string& name, const std::string& info_json);

}  // namespace fact::realize
