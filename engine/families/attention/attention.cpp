#include "families/attention/attention.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <regex>
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

std::string element_type(const std::string& dtype) {
  if (dtype != "bf16" && dtype != "f16" && dtype != "f32") {
    throw NotSupported("attention in " + dtype + " has no generated kernel (bf16, f16 and f32 only)");
  }
  return cutlass_element(dtype);
}

// The sm80 kernel's warps hold a (block_q x block_kv) score tile between them, 32 x 32 each.
int sm80_warps(const AttentionConfig& c) { return c.block_q * c.block_kv / (32 * 32); }
constexpr int kSm80MaxWarps = 8;  // 16 warps (512 threads) would leave 128 registers a thread

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
    if (step == "bias") {
      throw NotSupported("an additive score bias (a position bias or padding mask): CUTLASS's FMHA adds none; "
                         "PyTorch's scaled_dot_product_attention takes it as attn_mask");
    }
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
  if (s.f32()) {
    if (s.head_dim > 128) {
      s.sm80_refusal = "head dim " + std::to_string(s.head_dim) + " (the sm80 kernel: at most 128)";
    } else if (a.value("out_layout", "bs(hd)") != "bs(hd)") {
      s.sm80_refusal = "output layout " + a.value("out_layout", std::string()) +
                       " (the sm80 kernel writes a contiguous (batch, seq, heads, dim) output only)";
    }
  }
  if (s.causal && s.seq_q > s.seq_k) {
    throw NotSupported("causal attention with more queries (" + std::to_string(s.seq_q) + ") than keys (" +
                       std::to_string(s.seq_k) + ")");
  }
  if (!a.contains("scale") || !a["scale"].is_number() || !(a["scale"].get<double>() > 0)) {
    throw NotSupported("attention without a positive constant softmax scale");
  }
  // The sm80 kernel's kMaxK bounds the head dim, sizes Q's shared-memory buffers and keeps the
  // output in registers when one key tile covers it: the head dim rounded up to 32, its K step
  // (96 stays 96; 128 ran 4 % slower at the MiniGPT shape).
  s.kernel_head_dim = s.f32() ? (s.head_dim + 31) / 32 * 32 : (s.head_dim + 15) / 16 * 16;
  return s;
}

std::string AttentionSpec::id() const { return short_hash(json({dtype, causal, kernel_head_dim}).dump()); }

std::string AttentionConfig::name() const {
  if (sm80()) {
    return "q" + std::to_string(block_q) + "kv" + std::to_string(block_kv) + "_ms_" + math;
  }
  std::string n = "q" + std::to_string(block_q) + "kv" + std::to_string(block_kv) + "_" +
                  (schedule == "pingpong" ? "pp" : "coop") + "_s" + std::to_string(stages_kv);
  if (mma_warpgroups != 2) n += "_wg" + std::to_string(mma_warpgroups);
  if (stages_q != mma_warpgroups) n += "_q" + std::to_string(stages_q);
  if (mainloop_locked) n += "_locked";
  if (overlap) n += "_ov";
  if (!math.empty()) n += "_" + math;
  return n;
}

bool AttentionConfig::is_name(const std::string& text) {
  static const std::regex shape(
      "q[0-9]+kv[0-9]+_((pp|coop)_s[0-9]+(_wg[0-9]+)?(_q[0-9]+)?(_locked)?(_ov)?(_tf32)?|ms_(tf32|3xtf32))");
  return std::regex_match(text, shape);
}

json AttentionConfig::to_json() const {
  if (sm80()) {
    return {{"name", name()}, {"block_q", block_q}, {"block_kv", block_kv}, {"schedule", schedule}, {"math", math}};
  }
  json j = {{"name", name()},         {"block_q", block_q},       {"block_kv", block_kv},
            {"schedule", schedule},   {"stages_kv", stages_kv},   {"mma_warpgroups", mma_warpgroups},
            {"mainloop_locked", mainloop_locked}};
  if (stages_q != mma_warpgroups) j["stages_q"] = stages_q;
  if (overlap) j["overlap"] = true;
  if (!math.empty()) j["math"] = math;
  return j;
}

int64_t attention_smem_bytes(const AttentionSpec& spec, const AttentionConfig& c) {
  FACT_CHECK(!c.sm80(), "attention_smem_bytes is the Hopper collective's");
  const int64_t bytes = dtype_size(spec.dtype);
  const int64_t q = static_cast<int64_t>(c.stages_q) * 64 * spec.kernel_head_dim;  // 64 rows a stage
  const int64_t kv = static_cast<int64_t>(c.stages_kv) * c.block_kv * spec.kernel_head_dim;
  // The budget reserves one epilogue buffer (64 rows x up to 64 columns of the output a warp
  // group, and its barriers); the persistent (ping-pong) kernel keeps one per MMA warp group.
  const int64_t d = spec.kernel_head_dim;
  const int64_t epilogue = c.schedule == "pingpong" ? 64 * std::min<int64_t>(d, 64) * bytes + 1024 : 0;
  return (q + kv) * bytes + epilogue;
}

json AttentionCandidates::to_json() const {
  json ranked_json = json::array();
  for (const auto& r : ranked) ranked_json.push_back({{"config", r.config.to_json()}, {"why", r.why}});
  return {{"family", "attention"}, {"ranked", ranked_json}, {"dropped", dropped}};
}

namespace {

// Hopper FMHA: K/V tile x schedule x stages, plus the locked mainloop for the cooperative kernel;
// configs whose tiles do not fit shared memory are dropped. f32 runs it in TF32 (`math`). K and
// V tiles take turns in the stages, and a warp group holds V_j until it has issued P_j+1 V_j+1
// while K_j+1 is in use: fewer than three stages deadlock (two did, on the H200).
std::vector<AttentionConfig> sm90_space(const AttentionSpec& spec, AttentionCandidates& out) {
  const std::string math = spec.f32() ? "tf32" : "";
  std::vector<AttentionConfig> space;
  for (const char* schedule : {"cooperative", "pingpong"}) {
    for (int block_kv : {128, 64}) {
      for (int stages : {5, 4, 3}) {
        // The persistent kernel's knobs: its warp groups' own GEMMs overlapped, and the next
        // tile's Q loaded during this one (the cooperative kernel runs one tile a CTA; there the
        // overlapped mainloop measured 3 % slower at both bf16 shapes).
        const bool persistent = std::string(schedule) == "pingpong";
        for (bool overlap : {true, false}) {
          for (int stages_q : {2, 4}) {
            if (!persistent && (overlap || stages_q != 2)) continue;
            AttentionConfig c;
            c.schedule = schedule;
            c.block_kv = block_kv;
            c.stages_kv = stages;
            c.stages_q = stages_q;
            c.overlap = overlap;
            c.math = math;
            space.push_back(c);
          }
        }
      }
    }
  }
  AttentionConfig locked;
  locked.mainloop_locked = true;
  locked.math = math;
  if (!math.empty()) locked.block_kv = 64;  // TF32 tiles: 128 keys x 5 stages fit head dims <= 32 only
  space.push_back(locked);
  std::vector<AttentionConfig> kept;
  for (const auto& c : space) {
    const int64_t smem = attention_smem_bytes(spec, c);
    if (smem > kSmemBudget) {
      out.dropped.push_back({{"config", c.to_json()},
                             {"reason", "shared memory: " + std::to_string(smem / 1024) + " KiB > " +
                                            std::to_string(kSmemBudget / 1024) + " KiB"}});
      continue;
    }
    kept.push_back(c);
  }
  // Prior order (measured on the H200, see bench/README.md): ping-pong (persistent, one tile's
  // softmax hides the other's GEMMs) leads for long sequences and, in 16-bit types, under a
  // causal mask, where its tile order puts the heaviest query tiles first (bf16: 0.196 against
  // the cooperative kernel's 0.236 ms at the MiniGPT shape, 0.259 against 0.287 at Llama's; TF32
  // not measured since); the cooperative kernel otherwise; larger K/V tiles and deeper pipelines
  // first. In TF32, where a 128-key tile leaves room for three stages only, the pipeline's depth
  // first (64 keys x 5 stages ran 14 % faster than 128 x 3 at the MiniGPT shape). Within equal
  // depths, the persistent kernel's overlapped mainloop and second tile's Q first (both: 0.1935
  // against 0.1986 ms at the MiniGPT shape, each alone 0.197; at Llama's, where 128 keys x 5
  // stages leave no room for the second Q, the overlapped mainloop 0.261 against 0.259).
  const bool pingpong_first = (spec.causal && math.empty()) || spec.seq_k >= 1024;
  auto prior = [&](const AttentionConfig& c) {
    int score = 0;
    score += (c.schedule == "pingpong") == pingpong_first ? 0 : 100;
    score += (c.block_kv == 128) == math.empty() ? 0 : 40;
    score += (5 - c.stages_kv) * 15;
    score += c.mainloop_locked ? 30 : 0;
    score -= (c.overlap ? 5 : 0) + (c.stages_q > c.mma_warpgroups ? 5 : 0);
    return score;
  };
  std::stable_sort(kept.begin(), kept.end(),
                   [&](const AttentionConfig& x, const AttentionConfig& y) { return prior(x) < prior(y); });
  return kept;
}

// The sm80 kernel (f32): query tile x key tile, in one math. Its shared memory (26-86 KiB for
// these tiles, fp32, head dim up to 128) always fits; its registers bound the warps.
std::vector<AttentionConfig> sm80_space(const AttentionSpec& spec, const std::string& precision,
                                        AttentionCandidates& out) {
  if (precision != "highest" && precision != "high" && precision != "medium") {
    throw NotSupported("float32 matmul precision '" + precision + "' (highest, high or medium)");
  }
  // TF32 where the policy allows it; fp32-accurate 3xTF32 where it asks for highest, from this
  // kernel only: a pattern it cannot compute is refused then.
  const std::string math = precision == "highest" ? "3xtf32" : "tf32";
  if (!spec.sm80_refusal.empty() && precision == "highest") {
    throw NotSupported("f32 attention under float32 matmul precision 'highest' runs the sm80 kernel in 3xTF32, "
                       "which cannot compute this pattern: " + spec.sm80_refusal);
  }
  // PyTorch's choice first (64 x 64 up to head dim 64, else 32 x 128), then more queries per
  // block (fewer K/V reloads), then the small tiles (more blocks for short sequences).
  const std::pair<int, int> small_head[] = {{64, 64}, {32, 128}, {64, 128}, {128, 64}, {32, 64}, {128, 128}};
  const std::pair<int, int> large_head[] = {{32, 128}, {64, 128}, {64, 64}, {128, 64}, {32, 64}, {128, 128}};
  std::vector<AttentionConfig> kept;
  for (const auto& [q, kv] : spec.kernel_head_dim <= 64 ? small_head : large_head) {
    AttentionConfig c;
    c.schedule = "multistage";
    c.block_q = q;
    c.block_kv = kv;
    c.stages_kv = 0;
    c.mma_warpgroups = 0;
    c.math = math;
    if (!spec.sm80_refusal.empty()) {
      out.dropped.push_back({{"config", c.to_json()}, {"reason", spec.sm80_refusal}});
      continue;
    }
    if (sm80_warps(c) > kSm80MaxWarps) {
      out.dropped.push_back({{"config", c.to_json()},
                             {"reason", "registers: " + std::to_string(sm80_warps(c)) + " warps of 32 x 32 scores > " +
                                            std::to_string(kSm80MaxWarps) + " (at most 128 registers a thread)"}});
      continue;
    }
    kept.push_back(c);
  }
  return kept;
}

// --configs: the ranked configs named in `names`, in rank order.
std::vector<RankedAttention> named_configs(const std::vector<RankedAttention>& ranked, const json& dropped,
                                           const std::vector<std::string>& names) {
  const std::set<std::string> wanted(names.begin(), names.end());
  std::vector<RankedAttention> kept;
  for (const auto& r : ranked) {
    if (wanted.count(r.config.name())) kept.push_back(r);
  }
  if (kept.empty()) {
    std::vector<std::pair<std::string, std::string>> reasons;
    for (const auto& d : dropped) reasons.emplace_back(d["config"].value("name", ""), d["reason"]);
    refuse_named(wanted, reasons);
  }
  return kept;
}

}  // namespace

AttentionCandidates attention_candidates(const AttentionSpec& spec, const std::string& signature,
                                         const json& problem, const std::string& arch, size_t top_n,
                                         const registry::Registry* reg, const std::string& precision,
                                         const std::vector<std::string>& only) {
  if (arch != "sm90") throw NotSupported("fused attention is emitted for sm90 only (asked for " + arch + ")");
  AttentionCandidates out;
  std::vector<AttentionConfig> kept = spec.f32() ? sm80_space(spec, precision, out) : sm90_space(spec, out);
  if (spec.f32() && precision != "highest") {
    // TF32 allowed: Hopper's FMHA in TF32 too. The two kernels' prior orders alternate, Hopper's
    // first; the ranked list below keeps one of each within a --candidates bound.
    const std::vector<AttentionConfig> sm80 = std::move(kept);
    const std::vector<AttentionConfig> sm90 = sm90_space(spec, out);
    kept.clear();
    for (size_t i = 0; i < std::max(sm80.size(), sm90.size()); ++i) {
      if (i < sm90.size()) kept.push_back(sm90[i]);
      if (i < sm80.size()) kept.push_back(sm80[i]);
    }
  }
  if (kept.empty()) {
    std::set<std::string> reasons;
    for (const auto& d : out.dropped) reasons.insert(d["reason"].get<std::string>());
    std::string why;
    for (const auto& r : reasons) why += (why.empty() ? "" : "; ") + r;
    throw NotSupported("no attention kernel config fits this pattern: " + why);
  }
  std::vector<RankedAttention> ranked;
  std::set<std::string> taken;
  if (reg) {
    for (const auto& hit : reg->lookup(signature, arch, problem, 64)) {
      // Only measurements of this problem or a close one (a factor of 4 over all sizes): a
      // kernel's rank at batch 4 x seq 2048 says little about batch 128 x seq 512. A config of
      // another math than the precision's is not in `kept`, so never comes back.
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
  if (!only.empty()) {
    out.ranked = named_configs(ranked, out.dropped, only);
    return out;
  }
  // Two kernels for one pattern (f32 in TF32): registry rows of one kernel must not crowd the
  // other out of a --candidates bound; its best ranked config takes the bound's last place.
  if (top_n > 1 && ranked.size() > top_n) {
    const bool first = ranked[0].config.sm80();
    const auto head = ranked.begin() + static_cast<std::ptrdiff_t>(top_n);
    const auto other_kernel = [&](const RankedAttention& r) { return r.config.sm80() != first; };
    if (std::none_of(ranked.begin(), head, other_kernel)) {
      const auto other = std::find_if(head, ranked.end(), other_kernel);
      if (other != ranked.end()) std::rotate(head - 1, other, other + 1);
    }
  }
  if (top_n > 0 && ranked.size() > top_n) ranked.resize(top_n);
  out.ranked = std::move(ranked);
  return out;
}

namespace {

std::string kernel_name(const AttentionSpec& spec, const AttentionConfig& c) {
  return "fact_attention_" + spec.dtype + (spec.causal ? "_causal" : "") + "_d" +
         std::to_string(spec.kernel_head_dim) + "_" + spec.id() + "_" + c.name();
}

// fact_kernel_info(): what the kernel computes, for the tuner's and the composer's checks.
json kernel_info(const AttentionSpec& spec, const AttentionConfig& c) {
  return {{"family", "attention"},
          {"dtype", spec.dtype},
          {"causal", spec.causal},
          {"head_dim", spec.kernel_head_dim},
          {"config", c.to_json()}};
}

}  // namespace

EmittedKernel emit_attention(const AttentionSpec& spec, const AttentionConfig& config) {
  return config.sm80() ? emit_attention_sm80(spec, config) : emit_attention_sm90(spec, config);
}

EmittedKernel emit_attention_sm90(const AttentionSpec& spec, const AttentionConfig& c) {
  const bool tf32 = spec.f32();
  FACT_CHECK(c.math == (tf32 ? "tf32" : ""), "Hopper's FMHA runs bf16 / f16, or f32 in TF32 (math '" + c.math + "')");
  FACT_CHECK(c.schedule == "cooperative" || c.schedule == "pingpong", "bad attention schedule " + c.schedule);
  FACT_CHECK(c.block_q == 64 * c.mma_warpgroups, "block_q must be 64 rows per MMA warp group");
  FACT_CHECK(!(c.overlap && c.mainloop_locked), "the overlapped mainloop has no locked form");
  FACT_CHECK(c.stages_q % c.mma_warpgroups == 0 && c.stages_q >= c.mma_warpgroups,
             "Q stages must be whole tiles (a multiple of the MMA warp groups)");
  EmittedKernel k;
  k.name = kernel_name(spec, c);
  json info = kernel_info(spec, c);
  if (tf32) {
    info["math"] = "tf32";
    info["v_keys_contiguous"] = true;  // reads such a V in place (v_stride_s 1, v_stride_d > 1)
  }
  std::map<std::string, std::string> vars = {
      {"description", std::string(spec.causal ? "causal" : "non-causal") + " attention, " + spec.dtype +
                          (tf32 ? " with TF32 tensor-core math" : "") + ", head dim up to " +
                          std::to_string(spec.kernel_head_dim)},
      {"kernel_name", k.name},
      {"abi_exports", abi_exports(k.name, info.dump())},
      {"tma_driver", templates::kTmaDriver},
      {"element", element_type(spec.dtype)},
      {"element_mma", tf32 ? "cutlass::tfloat32_t" : element_type(spec.dtype)},
      {"math", tf32 ? "TF32 MMAs (float32 matmul precision high or medium), fp32 accumulation and output"
                    : spec.dtype + " MMAs, fp32 accumulation"},
      {"transpose_v", tf32 ? "true" : "false"},
      {"block_q", std::to_string(c.block_q)},
      {"block_kv", std::to_string(c.block_kv)},
      {"head_dim", std::to_string(spec.kernel_head_dim)},
      {"stages_kv", std::to_string(c.stages_kv)},
      {"stages_q", std::to_string(c.stages_q)},
      {"mma_warpgroups", std::to_string(c.mma_warpgroups)},
      {"mainloop_locked", c.mainloop_locked ? "cute::true_type" : "cute::false_type"},
      {"overlap", c.overlap ? "true" : "false"},
      {"overlap_note", c.overlap ? ", each warp group's softmax overlapping its own P @ V" : ""},
      {"schedule", c.schedule},
      // Keys past seq_k are zero-filled by TMA: the causal mask hides them (seq_q <= seq_k), the
      // residual fusion masks them in the last K/V tile otherwise.
      {"fusion", spec.causal ? "cutlass::fmha::collective::CausalFusion" : "cutlass::fmha::collective::ResidualFusion"},
      {"causal", spec.causal ? "true" : "false"},
      {"persistent", c.schedule == "pingpong" ? "true" : "false"},
  };
  k.source = substitute(templates::kAttentionSm90, vars);
  return k;
}

EmittedKernel emit_attention_sm80(const AttentionSpec& spec, const AttentionConfig& c) {
  FACT_CHECK(spec.f32(), "the sm80 attention kernel is emitted for f32 only");
  FACT_CHECK(c.sm80(), "bad sm80 attention schedule " + c.schedule);
  FACT_CHECK(c.math == "tf32" || c.math == "3xtf32", "bad sm80 attention math '" + c.math + "'");
  FACT_CHECK(c.block_q % 32 == 0 && c.block_kv % 32 == 0 && sm80_warps(c) <= kSm80MaxWarps,
             "bad sm80 attention tile " + c.name());
  EmittedKernel k;
  k.name = kernel_name(spec, c);
  json info = kernel_info(spec, c);
  info["math"] = c.math;
  // what the kernel's addressing allows (the Hopper kernels take any strides and groups)
  info["out_layouts"] = {"bs(hd)"};
  // grouped-query: one launch per K/V head, its query heads sharing it, in whole blocks of
  // block_q rows when more than one block (fact::attention's impl checks that from here)
  info["kv_groups"] = "one launch per K/V head";
  const bool tf32 = c.math == "tf32";
  std::map<std::string, std::string> vars = {
      {"description", std::string(spec.causal ? "causal" : "non-causal") + " attention, " + spec.dtype + " with " +
                          (tf32 ? "TF32" : "3xTF32 (fp32-accurate)") + " tensor-core math, head dim up to " +
                          std::to_string(spec.kernel_head_dim)},
      {"kernel_name", k.name},
      {"abi_exports", abi_exports(k.name, info.dump())},
      {"block_q", std::to_string(c.block_q)},
      {"block_kv", std::to_string(c.block_kv)},
      {"head_dim", std::to_string(spec.kernel_head_dim)},
      {"math", tf32 ? "one TF32 MMA per product (float32 matmul precision high or medium)"
                    : "3xTF32: each product split into big and small TF32 halves (fp32-accurate)"},
      {"operator", tf32 ? "cutlass::arch::OpMultiplyAdd" : "cutlass::arch::OpMultiplyAddFastF32"},
      {"causal", spec.causal ? "true" : "false"},
  };
  k.source = substitute(templates::kAttentionSm80, vars);
  return k;
}

const char* attention_abi_header_text() { return templates::kAttentionAbiHeader; }

}  // namespace fact::realize
