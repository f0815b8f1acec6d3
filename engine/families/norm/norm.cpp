#include "families/norm/norm.h"

#include <algorithm>
#include <map>

#include "ir/error.h"
#include "realize_templates.h"

namespace fact::realize {

using nlohmann::json;

namespace {

std::string cuda_type(const std::string& dtype) { return realize::cuda_type(dtype, "row-norm"); }

std::string operand_dtype(const json& pattern, const std::string& role) {
  for (const auto& o : pattern.at("operands")) {
    if (o.value("role", "") == role) {
      const std::string type = o.value("type", "");
      return type.substr(0, type.find('['));
    }
  }
  return "";
}

constexpr int kMaxItems = 16;  // vectors per thread: 16 x 8 floats in registers at most

}  // namespace

NormSpec NormSpec::from_pattern(const json& p) {
  if (p.at("family") != "norm") throw NotSupported("not a norm pattern");
  NormSpec s;
  const auto& a = p.at("attrs");
  s.kind = a.at("kind");
  if (s.kind != "layer_norm" && s.kind != "rms_norm") throw NotSupported("norm kind " + s.kind);
  s.dtype_in = a.at("dtype_in");
  s.dtype_out = a.at("dtype_out");
  cuda_type(s.dtype_in);
  cuda_type(s.dtype_out);
  const std::string w = operand_dtype(p, "weight"), b = operand_dtype(p, "bias");
  s.has_weight = !w.empty();
  s.has_bias = !b.empty();
  if (s.has_weight && s.has_bias && w != b) throw NotSupported("weight and bias of different dtypes");
  s.dtype_weight = s.has_weight ? w : b;
  if (!s.dtype_weight.empty()) cuda_type(s.dtype_weight);
  s.dtype_round = a.value("round_to", "");
  s.round_before_weight = s.has_weight && !s.dtype_round.empty() && s.dtype_round != "f32";
  if (s.round_before_weight) cuda_type(s.dtype_round);
  s.stats = a.value("stats", false);
  if (s.stats && (s.kind != "layer_norm" || s.has_weight || s.has_bias || s.dtype_out != "f32")) {
    throw NotSupported("row statistics are a LayerNorm's f32 mean and rstd, without weight or bias");
  }
  s.cols = p.at("problem").at("cols").get<int64_t>();
  const int vec = s.vector_width();
  if (s.cols <= 0 || s.cols % vec != 0) {
    throw NotSupported("row length " + std::to_string(s.cols) + " is not a multiple of " + std::to_string(vec) +
                       " (16-byte vectors)");
  }
  if (s.cols / vec > 1024 * kMaxItems) throw NotSupported("rows longer than one block can hold in registers");
  return s;
}

int NormSpec::vector_width() const { return 16 / dtype_size(dtype_in); }

std::string NormSpec::id() const {
  return short_hash(
      json({kind, dtype_in, dtype_out, dtype_weight, has_weight, has_bias, round_before_weight, dtype_round, cols})
              .dump() +
      (stats ? "|stats" : ""));
}

json NormConfig::to_json() const { return {{"name", name()}, {"threads", threads}, {"items", items}}; }

std::vector<NormConfig> norm_configs(const NormSpec& spec) {
  const int64_t vecs = spec.cols / spec.vector_width();
  std::vector<NormConfig> out;
  for (int per_thread : {1, 2, 4}) {
    int64_t threads = (vecs + per_thread - 1) / per_thread;
    threads = std::clamp<int64_t>((threads + 31) / 32 * 32, 32, 1024);
    const int items = static_cast<int>((vecs + threads - 1) / threads);
    if (items > kMaxItems) continue;
    const bool seen = std::any_of(out.begin(), out.end(), [&](const NormConfig& c) { return c.threads == threads; });
    if (!seen) out.push_back({static_cast<int>(threads), items});
  }
  return out;
}

EmittedKernel emit_norm(const NormSpec& spec, const NormConfig& c) {
  FACT_CHECK(c.threads % 32 == 0 && c.threads <= 1024 && c.items >= 1, "bad norm config " + c.name());
  EmittedKernel k;
  k.name = "fact_" + spec.kind + (spec.stats ? "_stats" : "") + "_" + spec.dtype_in + "_" + spec.dtype_out + "_" +
           spec.id() + "_" + c.name();
  const json info = {{"family", "norm"},
                     {"kind", spec.kind},
                     {"dtype_in", spec.dtype_in},
                     {"dtype_out", spec.dtype_out},
                     {"dtype_weight", spec.dtype_weight},
                     {"has_weight", spec.has_weight},
                     {"has_bias", spec.has_bias},
                     {"round_before_weight", spec.round_before_weight},
                     {"dtype_round", spec.dtype_round},
                     {"cols", spec.cols},
                     {"stats", spec.stats},
                     {"config", c.to_json()}};
  const std::string w = spec.dtype_weight.empty() ? "float" : cuda_type(spec.dtype_weight);
  std::map<std::string, std::string> vars = {
      {"description", spec.stats ? spec.kind + " statistics (mean, rstd) of rows of " + std::to_string(spec.cols) +
                                       " " + spec.dtype_in
                                 : spec.kind + " over rows of " + std::to_string(spec.cols) + " " + spec.dtype_in +
                                       " -> " + spec.dtype_out + (spec.has_weight ? ", weight" : "") +
                                       (spec.has_bias ? ", bias" : "")},
      {"stats", spec.stats ? "true" : "false"},
      {"kernel_name", k.name},
      {"abi_exports", abi_exports(k.name, info.dump())},
      {"launch", templates::kLaunch},
      {"t_in", cuda_type(spec.dtype_in)},
      {"t_out", cuda_type(spec.dtype_out)},
      {"t_weight", w},
      {"cols", std::to_string(spec.cols)},
      {"threads", std::to_string(c.threads)},
      {"items", std::to_string(c.items)},
      {"vec", std::to_string(spec.vector_width())},
      {"rms", spec.kind == "rms_norm" ? "true" : "false"},
      {"has_weight", spec.has_weight ? "true" : "false"},
      {"has_bias", spec.has_bias ? "true" : "false"},
      {"round_before_weight", spec.round_before_weight ? "true" : "false"},
      {"t_round", spec.round_before_weight ? cuda_type(spec.dtype_round) : "float"},
  };
  k.source = substitute(templates::kNormRows, vars);
  return k;
}

const char* norm_abi_header_text() { return templates::kNormAbiHeader; }

}  // namespace fact::realize
