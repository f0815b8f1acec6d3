// Stage 1, top to bottom: load the traced graph, discover and plan patterns, attach what the
// registry knows and the parameter ranges to search. Each step is one call; the result is the
// plan (docs/plan-format.md) plus what the report and `fact explain` need.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "discover/cost_model.h"
#include "discover/planner.h"
#include "ir/graph.h"

namespace fact {

struct DiscoverOptions {
  std::string graph_path;
  std::string arch = "sm90";
  std::string gpu;            // empty: the arch's default GPU
  std::string registry_path;  // empty: Registry::default_path()
};

struct DiscoverResult {
  ir::Graph graph;
  discover::Discovery discovery;
  nlohmann::json plan;
};

DiscoverResult run_discover(const DiscoverOptions& opt);

}  // namespace fact
