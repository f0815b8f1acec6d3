// The kernel families as the pipeline sees them: one entry per family, and a stage that differs
// per family goes through this table instead of an if-chain. Everything else of a family lives
// in its folder, engine/families/<family>/: its rules, its spec, configs and filter, its emitter,
// templates and ABI header.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "discover/catalog.h"
#include "discover/pattern.h"
#include "ir/graph.h"
#include "realize/kernel.h"
#include "util/files.h"

namespace fact::registry {
class Registry;
}

namespace fact::families {

// Stage 2 for one chosen pattern: what a family's realize step reads, and the two things it may
// do (add a kernel to compile, or refuse with the reason the manifest shows).
struct RealizeStep {
  const discover::Match* match = nullptr;
  const nlohmann::json* pattern = nullptr;  // the plan's pattern
  std::string arch;                     // sm90 | sm80
  size_t candidates = 8;                // --candidates N: ranked configs per pattern
  std::string precision = "highest";    // float32 matmul precision of the plan
  const registry::Registry* registry = nullptr;  // may be null
  std::vector<std::string> gemm_configs, attention_configs;  // --configs, by family
  std::filesystem::path candidates_file;  // where the pattern's candidates are listed
  nlohmann::json base;                    // manifest row fields of every kernel of the pattern
  // One kernel of the pattern (its source once, its manifest row after compiling).
  std::function<void(realize::EmittedKernel, nlohmann::json config)> add_kernel;
  // The pattern (entry: base, with a config where it is one config that fails) cannot be built.
  std::function<void(nlohmann::json entry, const std::string& why)> refuse;
};

struct FamilyEntry {
  discover::Family id;
  // Its rooted rules, in the order the catalog lists them (none: pointwise regions, which the
  // planner groups from what the other rules left).
  std::vector<discover::Rule> (*rules)();
  // The tunable ranges the plan reports for a match on `arch` (sm90 | sm80), read off CUTLASS's
  // hierarchy (tiles, clusters, schedules, stages, ...); stage 2 enumerates and filters them.
  nlohmann::json (*search_space)(const discover::Match& m, const std::string& arch);
  // The pattern's kernels through step.add_kernel, or step.refuse with why there are none.
  void (*realize)(RealizeStep& step);
  // Optional: the other forms stage 2 may realize a pattern in, added to its plan entry (a GEMM
  // epilogue as a library GEMM plus a pointwise "tail"; a gated MLP "lowered" to one GEMM).
  void (*plan_forms)(const ir::Graph& g, const discover::Match& match, nlohmann::json& pattern) = nullptr;
};

// For families realize does not rank (row norms, pointwise regions): every config of `spec` as a
// kernel, and the candidates file listing them; verified and timed where they run.
template <class Spec, class Configs, class Emit>
void emit_every_config(RealizeStep& step, const Spec& spec, const Configs& configs, Emit emit) {
  nlohmann::json listed = nlohmann::json::array();
  for (const auto& c : configs) {
    listed.push_back(c.to_json());
    step.add_kernel(emit(spec, c), c.to_json());
  }
  write_text_file(step.candidates_file,
                  nlohmann::json({{"family", (*step.pattern)["family"]}, {"configs", listed}}).dump(2));
}

// Every family, in discover::Family order.
const std::vector<FamilyEntry>& table();
const FamilyEntry& family(discover::Family id);

// The entries' parts (engine/families/<family>/entry.cpp). The GEMM step realizes the three
// GEMM-shaped families: gemm, horizontal_gemm and gated_mlp.
std::vector<discover::Rule> gemm_rules();
std::vector<discover::Rule> horizontal_gemm_rules();
std::vector<discover::Rule> gated_mlp_rules();
std::vector<discover::Rule> attention_rules();
std::vector<discover::Rule> norm_rules();
nlohmann::json gemm_search_space(const discover::Match& m, const std::string& arch);
nlohmann::json attention_search_space(const discover::Match& m, const std::string& arch);
nlohmann::json norm_search_space(const discover::Match& m, const std::string& arch);
nlohmann::json pointwise_search_space(const discover::Match& m, const std::string& arch);
void realize_gemm(RealizeStep& step);
void gemm_plan_forms(const ir::Graph& g, const discover::Match& match, nlohmann::json& pattern);
void gated_mlp_plan_forms(const ir::Graph& g, const discover::Match& match, nlohmann::json& pattern);
void realize_attention(RealizeStep& step);
void realize_norm(RealizeStep& step);
void realize_pointwise(RealizeStep& step);

}  // namespace fact::families
