// The rule catalog: data. Each rule names its kernel family, the ops it can be rooted at, the
// math its fused kernel computes, and a matcher that returns a Match or says why not. Each family
// lists its own rules (engine/families/family.h); the catalog is their concatenation, in family
// order.
//
// Matchers live in their family's folder (engine/families/<family>/rule_*.cpp). A rule that fires records its name in the
// Match, so reports and `fact explain` say which rule covered which node.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "discover/pattern.h"
#include "ir/graph.h"

namespace fact::discover {

struct Rule {
  std::string name;
  Family family;
  std::set<ir::Op> roots;  // the ops a match is anchored at
  std::string math;        // one-line description of what the fused kernel computes
  std::function<Attempt(const ir::Graph&, int root)> match;
  // Optional: the match at `root` that leaves the `taken` nodes (a flag per node) to the patterns
  // that beat it, such as a GEMM without the part of its epilogue another GEMM's took. The
  // planner tries it on candidates that lost an overlap.
  std::function<Attempt(const ir::Graph&, int root, const std::vector<char>& taken)> shrink = nullptr;
};

const std::vector<Rule>& catalog();

// Matchers (engine/families/<family>/rule_*.cpp).
Attempt match_gemm_epilogue(const ir::Graph& g, int root);
Attempt shrink_gemm_epilogue(const ir::Graph& g, int root, const std::vector<char>& taken);
Attempt match_horizontal_gemm(const ir::Graph& g, int root);
Attempt match_gated_mlp(const ir::Graph& g, int root);
Attempt match_attention_handwritten(const ir::Graph& g, int root);
Attempt match_attention_sdpa(const ir::Graph& g, int root);
Attempt match_norm_op(const ir::Graph& g, int root);
Attempt match_rms_norm_handwritten(const ir::Graph& g, int root);
Attempt match_layer_norm_handwritten(const ir::Graph& g, int root);

// Not a rooted rule: after the planner has chosen, the pointwise ops left uncovered (`covered`
// is indexed by node id) grouped into single-exit regions, in program order (rule_pointwise.cpp).
std::vector<Match> pointwise_regions(const ir::Graph& g, const std::vector<char>& covered);

// Helpers shared by matchers.
Attempt miss(const std::string& rule, int root, int at, int progress, const std::string& reason);
// Sort and de-duplicate a node list.
void normalize(std::vector<int>& nodes);
// Add view/identity chain nodes (each chain nearest first) to `nodes` while every user of each is
// already in `nodes`, until nothing changes: the fused kernel then reads the producer in place.
void absorb_chains(const ir::Graph& g, const std::vector<std::vector<int>>& chains,
                   std::vector<int>& nodes);

}  // namespace fact::discover
