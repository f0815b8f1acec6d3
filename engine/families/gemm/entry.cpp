// The GEMM-shaped families' entries in the family table (gemm, horizontal_gemm, gated_mlp): their
// rules, the plan's search space, and stage 2: the ranked configs of the pattern, one emitted
// kernel each, and for a GEMM with an epilogue (or a gated MLP) the pointwise kernels of its
// library-GEMM form.
#include "discover/catalog.h"
#include "families/family.h"
#include "families/gemm/candidates.h"
#include "families/gemm/emit.h"
#include "families/pointwise/pointwise.h"

namespace fact::families {

using nlohmann::json;
using ir::Op;

namespace {

bool is_fp32(const discover::Match& m) {
  const auto& a = m.attrs;
  const std::string dtype = a.contains("dtype_a") ? a["dtype_a"].get<std::string>() : a.value("dtype", "");
  return dtype == "f32";
}

// CUTLASS 3.x SM90 GEMMs: TMA + WGMMA, warp-specialized kernel schedules.
json space_sm90(const discover::Match& m) {
  const auto& p = m.problem;
  const bool large_k = p.value("k", 0) >= 16 * std::max<int64_t>(p.value("m", 1), p.value("n", 1));
  json s = {
      {"tile_m", {64, 128, 256}},
      {"tile_n", {64, 128, 256}},
      {"tile_k", is_fp32(m) ? json{32} : json{64, 128}},
      {"cluster", {"1x1", "2x1", "1x2", "2x2"}},
      {"kernel_schedule", {"warpspecialized_cooperative", "warpspecialized_pingpong"}},
      {"epilogue_schedule", {"tma_warpspecialized_cooperative", "tma_warpspecialized"}},
      {"stages", {"auto", 3, 4, 5, 6}},
      {"raster", {"along_m", "along_n"}},
      {"swizzle", {1, 2, 4, 8}},
      // stream-K kernels' run-time knobs (LaunchKnobs): the decomposition, and split-K factors
      {"decomposition", {"heuristic", "stream_k", "data_parallel"}},
      {"splits", large_k ? json{1, 2, 4} : json{1}},
  };
  if (is_fp32(m)) s["math"] = {"tf32", "3xtf32"};  // by precision policy: high | highest
  return s;
}

// CUTLASS 2.x SM80 GEMMs: cp.async multistage, mma.sync.
json space_sm80(const discover::Match& m) {
  json s = {{"tile_m", {64, 128, 256}}, {"tile_n", {64, 128, 256}}, {"tile_k", {32, 64}},
            {"warps", {"2x2", "4x2", "2x4"}}, {"stages", {3, 4, 5}}, {"swizzle", {1, 2, 4, 8}},
            {"split_k", {1, 2, 4, 8, 16}}};
  if (is_fp32(m)) s["math"] = {"tf32", "3xtf32", "simt"};
  return s;
}

}  // namespace

json gemm_search_space(const discover::Match& m, const std::string& arch) {
  return arch == "sm90" ? space_sm90(m) : space_sm80(m);
}

std::vector<discover::Rule> gemm_rules() {
  using discover::Family;
  return {{"gemm_epilogue", Family::gemm, {Op::mm, Op::addmm, Op::bmm, Op::baddbmm, Op::matmul, Op::linear},
           "D = epilogue(A @ B, operands...)  // any pointwise tail over the accumulator",
           discover::match_gemm_epilogue, discover::shrink_gemm_epilogue}};
}

std::vector<discover::Rule> horizontal_gemm_rules() {
  return {{"horizontal_gemm", discover::Family::horizontal_gemm, {Op::mm, Op::addmm, Op::matmul, Op::linear},
           "[D1 | D2 | ...] = A @ [B1 | B2 | ...] (+ biases)  // GEMMs sharing A, one launch",
           discover::match_horizontal_gemm}};
}

std::vector<discover::Rule> gated_mlp_rules() {
  return {{"gated_mlp", discover::Family::gated_mlp, {Op::mul},
           "D = act(A @ B1) * (A @ B2)  // SwiGLU / GeGLU, one GEMM over [B1 | B2]", discover::match_gated_mlp}};
}

void realize_gemm(RealizeStep& step) {
  const auto& match = *step.match;
  const auto& pattern = *step.pattern;
  if (pattern.contains("tail")) {
    // The library-GEMM form of a GEMM or gated MLP pattern: its pointwise kernels for the
    // epilogue, checked in context like regions.
    try {
      const auto spec = realize::PointwiseSpec::from_pattern(pattern["tail"]);
      const bool gated = match.family == discover::Family::gated_mlp;
      for (const auto& c : gated ? realize::pointwise_configs(spec) : realize::tail_configs(spec)) {
        json config = c.to_json();
        config["form"] = "tail";
        step.add_kernel(realize::emit_pointwise(spec, c), config);
      }
    } catch (const realize::NotSupported& e) {
      json entry = step.base;
      entry["config"] = {{"form", "tail"}};
      step.refuse(entry, e.what());
    }
  }
  // A gated MLP is realized as its gate GEMM with act(acc) * up fused into the epilogue
  // (the up projection stays PyTorch's GEMM); the plan keeps that GEMM pattern as "lowered".
  json gemm_pattern = pattern;
  discover::Match gemm_match = match;
  if (match.family == discover::Family::gated_mlp) {
    if (!pattern.contains("lowered")) {
      try {
        realize::lower_gated_mlp(pattern);  // throws with the reason
      } catch (const realize::NotSupported& e) {
        step.refuse(step.base, e.what());
      }
      return;
    }
    gemm_pattern = pattern["lowered"];
    gemm_match.family = discover::Family::gemm;
    gemm_match.epilogue = gemm_pattern["epilogue"].get<std::vector<std::string>>();
    gemm_match.operands.push_back({"up", -1, "full"});
  }
  if (!realize::supports_candidates(gemm_match, step.arch)) {
    step.refuse(step.base, std::string("no kernel family for ") + discover::family_name(match.family) + " on " +
                               step.arch + " yet");
    return;
  }
  realize::Candidates cands;
  realize::GemmSpec spec;
  try {
    spec = realize::GemmSpec::from_pattern(gemm_pattern);
    realize::CandidateOptions copt;
    copt.arch = step.arch;
    copt.top_n = step.candidates;
    copt.only = step.gemm_configs;
    copt.precision = step.precision;
    copt.registry = step.registry;
    cands = realize::candidates(gemm_match, copt);
  } catch (const realize::NotSupported& e) {
    step.refuse(step.base, e.what());
    return;
  }
  write_text_file(step.candidates_file, realize::candidates_json(cands).dump(2));
  if (cands.ranked.empty()) {
    step.refuse(step.base, realize::why_none_kept(cands.dropped) + " (candidates/" +
                               step.candidates_file.filename().string() + " lists each config with its reasons)");
    return;
  }
  for (const auto& ranked : cands.ranked) {
    json entry = step.base;
    entry["config"] = ranked.config.to_json();
    try {
      step.add_kernel(realize::emit_gemm(spec, ranked.config), entry["config"]);
    } catch (const realize::NotSupported& e) {
      step.refuse(entry, e.what());
    }
  }
}

void gemm_plan_forms(const ir::Graph& g, const discover::Match& match, json& pattern) {
  if (match.epilogue.empty() || match.anchors.empty()) return;
  try {
    pattern["tail"] = realize::gemm_epilogue_tail(pattern, g.node(match.output).type().shape,
                                                  ir::dtype_name(g.node(match.anchors.front()).type().dtype));
  } catch (const realize::NotSupported&) {
    // the fused kernels and the library candidates only
  }
}

void gated_mlp_plan_forms(const ir::Graph&, const discover::Match&, json& pattern) {
  // How stage 2 realizes it: the gate GEMM with act(acc) * up in its epilogue.
  try {
    pattern["lowered"] = realize::lower_gated_mlp(pattern);
    // ... or library GEMMs and act(gate) * up in one generated pointwise kernel.
    pattern["tail"] = realize::gated_mlp_tail(pattern["lowered"]);
  } catch (const realize::NotSupported&) {
    // no fused form: realize reports the pattern as not supported
  }
}

}  // namespace fact::families
