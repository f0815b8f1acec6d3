#include "realize/kernel.h"

#include <cstdio>
#include <sstream>

#include "ir/error.h"
#include "realize_templates.h"

namespace fact::realize {

using nlohmann::json;

void refuse_named(const std::set<std::string>& names, const std::vector<std::pair<std::string, std::string>>& dropped) {
  std::string why;
  std::set<std::string> found;
  auto add = [&](const std::string& line) { why += (why.empty() ? "" : "; ") + line; };
  for (const auto& [name, reason] : dropped) {
    if (!names.count(name)) continue;
    found.insert(name);
    add(name + ": " + reason);
  }
  for (const auto& name : names) {
    if (!found.count(name)) add(name + ": not in this pattern's configuration space");
  }
  throw NotSupported("none of the configs asked for (--configs) fits this problem: " + why);
}

std::string cutlass_element(const std::string& dtype) {
  if (dtype == "bf16") return "cutlass::bfloat16_t";
  if (dtype == "f16") return "cutlass::half_t";
  if (dtype == "f32") return "float";
  throw NotSupported("dtype " + dtype + " has no CUTLASS sm90 GEMM path in FACT yet");
}

std::string cuda_type(const std::string& dtype, const std::string& family, bool with_bool) {
  if (dtype == "bf16") return "__nv_bfloat16";
  if (dtype == "f16") return "__half";
  if (dtype == "f32") return "float";
  if (dtype == "bool" && with_bool) return "bool";
  throw NotSupported("dtype " + dtype + " has no " + family + " kernel");
}

int dtype_size(const std::string& dtype) { return dtype == "f32" ? 4 : dtype == "bool" ? 1 : 2; }

std::vector<int64_t> type_shape(const std::string& type) {
  const auto open = type.find('['), close = type.rfind(']');
  if (open == std::string::npos || close == std::string::npos || close < open) {
    throw NotSupported("the operand type '" + type + "' has no shape");
  }
  std::vector<int64_t> shape;
  std::istringstream in(type.substr(open + 1, close - open - 1));
  for (std::string item; std::getline(in, item, ',');) {
    try {
      size_t used = 0;
      shape.push_back(std::stoll(item, &used));
    } catch (const std::exception&) {
      throw NotSupported("the operand type '" + type + "' has a size that is not a number");
    }
  }
  return shape;
}

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

std::string substitute(const std::string& text, const std::map<std::string, std::string>& vars) {
  std::string out;
  out.reserve(text.size() * 2);
  std::set<std::string> used;
  size_t pos = 0;
  while (true) {
    const size_t start = text.find("${", pos);
    if (start == std::string::npos) {
      out.append(text, pos, std::string::npos);
      break;
    }
    const size_t end = text.find('}', start);
    FACT_CHECK(end != std::string::npos, "unterminated ${ in template");
    const std::string key = text.substr(start + 2, end - start - 2);
    auto it = vars.find(key);
    FACT_CHECK(it != vars.end(), "template placeholder ${" + key + "} has no value");
    out.append(text, pos, start - pos);
    out += it->second;
    used.insert(key);
    pos = end + 1;
  }
  for (const auto& [k, v] : vars) FACT_CHECK(used.count(k), "template variable '" + k + "' is not used");
  return out;
}

const char* abi_header_text() { return templates::kAbiHeader; }

std::string abi_exports(const std::string& name, const std::string& info_json) {
  return substitute(templates::kAbiExports, {{"kernel_name", name}, {"kernel_info", info_json}});
}

void check_expression_size(const json& ssa) {
  if (ssa.size() > kMaxExpressionSteps) {
    throw NotSupported("an expression of " + std::to_string(ssa.size()) + " steps; kernels are emitted for at most " +
                       std::to_string(kMaxExpressionSteps) + " (the region stays PyTorch's)");
  }
}

std::string short_hash(const std::string& text) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fnv1a(text)));
  return std::string(buf).substr(0, 10);
}

}  // namespace fact::realize
