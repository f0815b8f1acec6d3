// Stage 1, top to bottom: load the traced graph, discover and plan patterns, attach what the
// registry knows and the parameter ranges to search. Each step is one call; the result is the
// plan (docs/plan-format.md) plus what the report and `fact explain` need.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "discover/cost_model.h"
#include "discover/planner.h"
#include "ir/graph.h"

namespace fact {

struct DiscoverOptions {
  std::string graph_path;
  std::string arch = "sm90";
  std::string gpu;            // empty: the arch's default GPU
  std::string registry_path;  // empty: Registry::default_path()
  std::string lowerings_path;  // a JSON list of lowerings to use besides the registry's accepted ones
};

struct DiscoverResult {
  ir::Graph graph;
  discover::Discovery discovery;
  nlohmann::json plan;
};

DiscoverResult run_discover(const DiscoverOptions& opt);

struct RealizeOptions {
  DiscoverOptions discover;
  std::string run_dir;        // where sources, logs, the manifest and the results table go
  size_t candidates = 8;      // configs compiled per pattern (`--candidates N`)
  std::vector<std::string> configs;  // `--configs`: exactly these config names, where they fit
  std::string cutlass_dir;    // empty: $CUTLASS_DIR
  std::string nvcc = "nvcc";
  std::string cache_dir;      // empty: realize::default_cache_dir()
  int jobs = 0;               // parallel nvcc processes; 0: realize::default_compile_jobs
  double compile_timeout_s = -1;  // per compile; -1: realize::default_compile_timeout(), 0: none
  bool quiet = false;
};

struct RealizeResult {
  nlohmann::json plan;
  nlohmann::json manifest;  // one entry per (pattern, kernel): config, library, status, log
  int compiled = 0, cached = 0, failed = 0, not_supported = 0;
};

// Stage 2 without the GPU: for every GEMM-family pattern of the plan, rank configs, emit one .cu
// each, compile them in parallel into the kernel cache, and lay out a run directory.
RealizeResult run_realize(const RealizeOptions& opt);

}  // namespace fact
