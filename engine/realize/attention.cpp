#include "realize/attention.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "ir/error.h"
#include "realize_templates.h"
#include "registry/registry.h"

namespace fact::realize {

using nlohmann::json;

namespace {

// Hopper's shared memory per block, less what the kernel keeps for barriers and the epilogue.
constexpr int64_t kSmemBudget = 227 * 1024 - 16 * 1024;

// Registry rows of problems farther than this (sum of |log2| size ratios) do not rank configs.
constexpr double kNearDistance = 2.0;

const std::set<std::string> kSteps = {"scale", "causal_mask", "softmax", "dropout"};

// The FMHA collective's P @ V step takes P from registers as 16- or 8-bit operands: no fp32/TF32.
std::string element_type(const std::string& dtype) {
  if (dtype != "bf16" && dtype != "f16") {
    throw NotSupported("attention in " + dtype +
                       " has no generated kernel (bf16 and f16 only; fp32 models keep PyTorch's attention)");
  }
  return cutlass_element(dtype);
}

int64_t get_int(const json& obj, const char* key, const std::string& what) {
  if (!obj.contains(key) || !obj[key].is_number_integer()) {
    throw NotSupported(what + " has no integer '" + key + "'");
  }
  return obj[key].get<int64_t>();
}

}  // namespace

AttentionSpec AttentionSpec::from_pattern(const json& p) {
  if (p.value("family", "") != "attention") throw NotSupported("not an attention pattern");
  const json& a = p.at("attrs");
  const json& prob = p.at("problem");
  for (const auto& step : p.value("epilogue", json::array())) {
    if (!kSteps.count(step.get<std::string>())) {
      throw NotSupported("attention step '" + step.get<std::string>() + "' has no place in the fused kernel");
    }
  }
  AttentionSpec s;
  s.dtype = a.value("dtype", "");
  element_type(s.dtype);
  if (a.value("out_dtype", s.dtype) != s.dtype) {
    throw NotSupported("attention output in " + a.value("out_dtype", std::string("?")) + " from " + s.dtype +
                       " inputs");
  }
  s.causal = a.value("causal", false);
  s.batch = get_int(prob, "batch", "the attention problem");
  s.heads = get_int(prob, "heads", "the attention problem");
  s.kv_heads = get_int(prob, "kv_heads", "the attention problem");
  s.seq_q = get_int(prob, "seq_q", "the attention problem");
  s.seq_k = get_int(prob, "seq_k", "the attention problem");
  s.head_dim = get_int(prob, "head_dim", "the attention problem");
  if (get_int(prob, "head_dim_v", "the attention problem") != s.head_dim) {
    throw NotSupported("value head dim " + prob["head_dim_v"].dump() + " differs from the query's " +
                       std::to_string(s.head_dim));
  }
  if (s.head_dim % 8 != 0 || s.head_dim > 256) {
    throw NotSupported("head dim " + std::to_string(s.head_dim) + " (the kernel needs a multiple of 8, at most 256)");
  }
  if (s.kv_heads <= 0 || s.heads % s.kv_heads != 0) {
    throw NotSupported("heads " + std::to_string(s.heads) + " is not a multiple of kv_heads " +
                       std::to_string(s.kv_heads));
  }
  if (s.causal && s.seq_q > s.seq_k) {
    throw NotSupported("causal attention with more queries (" + std::to_string(s.seq_q) + ") than keys (" +
                       std::to_string(s.seq_k) + ")");
  }
  if (!a.contains("scale") || !a["scale"].is_number() || !(a["scale"].get<double>() > 0)) {
    throw NotSupported("attention without a positive constant softmax scale");
  }
  s.kernel_head_dim = (s.head_dim + 15) / 16 * 16;
  return s;
}

std::string AttentionSpec::id() const { return short_hash(json({dtype, causal, kernel_head_dim}).dump()); }

std::string AttentionConfig::name() const {
  std::string n = "q" + std::to_string(block_q) + "kv" + std::to_string(block_kv) + "_" +
                  (schedule == "pingpong" ? "pp" : "coop") + "_s" + std::to_string(stages_kv);
  if (mma_warpgroups != 2) n += "_wg" + std::to_string(mma_warpgroups);
  if (mainloop_locked) n += "_locked";
  return n;
}

json AttentionConfig::to_json() const {
  return {{"name", name()},         {"block_q", block_q},       {"block_kv", block_kv},
          {"schedule", schedule},   {"stages_kv", stages_kv},   {"mma_warpgroups", mma_warpgroups},
          {"mainloop_locked", mainloop_locked}};
}

int64_t attention_smem_bytes(const AttentionSpec& spec, const AttentionConfig& c) {
  const int64_t bytes = 2;  // bf16 / f16
  const int64_t q = static_cast<int64_t>(c.block_q) * spec.kernel_head_dim;  // one stage per MMA warp group
  const int64_t kv = static_cast<int64_t>(c.stages_kv) * c.block_kv * spec.kernel_head_dim;
  return (q + kv) * bytes;
}

json AttentionCandidates::to_json() const {
  json ranked_json = json::array();
  for (const auto& r : ranked) ranked_json.push_back({{"config", r.config.to_json()}, {"why", r.why}});
  return {{"family", "attention"}, {"ranked", ranked_json}, {"dropped", dropped}};
}

AttentionCandidates attention_candidates(const AttentionSpec& spec, const std::string& signature,
                                         const json& problem, const std::string& arch, size_t top_n,
                                         const registry::Registry* reg) {
  if (arch != "sm90") throw NotSupported("fused attention is emitted for sm90 only (asked for " + arch + ")");
  // The space: K/V tile x schedule x stages, plus the locked mainloop for the cooperative kernel.
  std::vector<AttentionConfig> space;
  for (const char* schedule : {"cooperative", "pingpong"}) {
    for (int block_kv : {128, 64}) {
      for (int stages : {5, 4, 3}) {
        AttentionConfig c;
        c.schedule = schedule;
        c.block_kv = block_kv;
        c.stages_kv = stages;
        space.push_back(c);
      }
    }
  }
  AttentionConfig locked;
  locked.mainloop_locked = true;
  space.push_back(locked);
  AttentionCandidates out;
  std::vector<AttentionConfig> kept;
  for (const auto& c : space) {
    const int64_t smem = attention_smem_bytes(spec, c);
    if (smem > kSmemBudget) {
      out.dropped.push_back({{"config", c.to_json()},
                             {"reason", "shared memory: " + std::to_string(smem / 1024) + " KiB of tiles > " +
                                            std::to_string(kSmemBudget / 1024) + " KiB"}});
      continue;
    }
    kept.push_back(c);
  }
  // Prior order (measured on the H200, see bench/README.md): the cooperative kernel leads for
  // short sequences, ping-pong (persistent, one tile's softmax hides the other's GEMMs) for long
  // ones; larger K/V tiles and deeper pipelines first.
  const bool long_seq = spec.seq_k >= 1024;
  auto prior = [&](const AttentionConfig& c) {
    int score = 0;
    score += (c.schedule == "pingpong") == long_seq ? 0 : 100;
    score += c.block_kv == 128 ? 0 : 40;
    score += (5 - c.stages_kv) * 15;
    score += c.mainloop_locked ? 30 : 0;
    return score;
  };
  std::stable_sort(kept.begin(), kept.end(),
                   [&](const AttentionConfig& x, const AttentionConfig& y) { return prior(x) < prior(y); });
  std::vector<RankedAttention> ranked;
  std::set<std::string> taken;
  if (reg) {
    for (const auto& hit : reg->lookup(signature, arch, problem, 64)) {
      // Only measurements of this problem or a close one (a factor of 4 over all sizes): a
      // kernel's rank at batch 4 x seq 2048 says little about batch 128 x seq 512.
      if (hit.row.disposition != "passed" || hit.distance > kNearDistance) continue;
      const std::string name = hit.row.config.value("name", "");
      auto it = std::find_if(kept.begin(), kept.end(), [&](const AttentionConfig& c) { return c.name() == name; });
      if (it == kept.end() || !taken.insert(name).second) continue;
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.1f", hit.row.time_us);
      ranked.push_back({*it, "registry: " + std::string(buf) + " us measured (" + hit.row.provenance + ", " +
                                 hit.match + " problem)"});
    }
  }
  for (const auto& c : kept) {
    if (taken.insert(c.name()).second) ranked.push_back({c, "prior"});
  }
  if (top_n > 0 && ranked.size() > top_n) ranked.resize(top_n);
  out.ranked = std::move(ranked);
  return out;
}

EmittedKernel emit_attention_sm90(const AttentionSpec& spec, const AttentionConfig& c) {
  FACT_CHECK(c.schedule == "cooperative" || c.schedule == "pingpong", "bad attention schedule " + c.schedule);
  FACT_CHECK(c.block_q == 64 * c.mma_warpgroups, "block_q must be 64 rows per MMA warp group");
  EmittedKernel k;
  k.name = "fact_attention_" + spec.dtype + (spec.causal ? "_causal" : "") + "_d" +
           std::to_string(spec.kernel_head_dim) + "_" + spec.id() + "_" + c.name();
  const json info = {{"family", "attention"},
                     {"dtype", spec.dtype},
                     {"causal", spec.causal},
                     {"head_dim", spec.kernel_head_dim},
                     {"config", c.to_json()}};
  std::map<std::string, std::string> vars = {
      {"description", std::string(spec.causal ? "causal" : "non-causal") + " attention, " + spec.dtype +
                          ", head dim up to " + std::to_string(spec.kernel_head_dim)},
      {"kernel_name", k.name},
      {"kernel_info", info.dump()},
      {"element", element_type(spec.dtype)},
      {"block_q", std::to_string(c.block_q)},
      {"block_kv", std::to_string(c.block_kv)},
      {"head_dim", std::to_string(spec.kernel_head_dim)},
      {"stages_kv", std::to_string(c.stages_kv)},
      {"mma_warpgroups", std::to_string(c.mma_warpgroups)},
      {"mainloop_locked", c.mainloop_locked ? "cute::true_type" : "cute::false_type"},
      {"schedule", c.schedule},
      {"dispatch", c.schedule == "pingpong" ? "cutlass::gemm::KernelTmaWarpSpecializedPingpong"
                                            : "cutlass::gemm::KernelTmaWarpSpecializedCooperative"},
      // Keys past seq_k are zero-filled by TMA: the causal mask hides them (seq_q <= seq_k), the
      // residual fusion masks them in the last K/V tile otherwise.
      {"fusion", spec.causal ? "cutlass::fmha::collective::CausalFusion" : "cutlass::fmha::collective::ResidualFusion"},
      {"causal", spec.causal ? "true" : "false"},
      {"persistent", c.schedule == "pingpong" ? "true" : "false"},
  };
  k.source = substitute(templates::kAttentionSm90, vars);
  return k;
}

const char* attention_abi_header_text() { return templates::kAttentionAbiHeader; }

}  // namespace fact::realize
