#include "discover/catalog.h"

#include <algorithm>

#include "families/family.h"

namespace fact::discover {

const char* family_name(Family f) {
  switch (f) {
    case Family::gemm: return "gemm";
    case Family::horizontal_gemm: return "horizontal_gemm";
    case Family::gated_mlp: return "gated_mlp";
    case Family::attention: return "attention";
    case Family::norm: return "norm";
    case Family::pointwise: return "pointwise";
  }
  return "?";
}

const std::vector<Rule>& catalog() {
  static const std::vector<Rule> rules = [] {
    std::vector<Rule> all;
    for (const auto& f : families::table()) {
      if (!f.rules) continue;
      for (auto& r : f.rules()) all.push_back(std::move(r));
    }
    return all;
  }();
  return rules;
}

Attempt miss(const std::string& rule, int root, int at, int progress, const std::string& reason) {
  Attempt a;
  a.misses.push_back(Miss{rule, root, at, progress, reason});
  return a;
}

void normalize(std::vector<int>& nodes) {
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
}

void absorb_chains(const ir::Graph& g, const std::vector<std::vector<int>>& chains,
                   std::vector<int>& nodes) {
  normalize(nodes);
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& chain : chains) {
      for (int id : chain) {
        if (std::binary_search(nodes.begin(), nodes.end(), id)) continue;
        bool all_users_in = !g.is_graph_output(id);
        for (int u : g.node(id).users) {
          all_users_in = all_users_in && std::binary_search(nodes.begin(), nodes.end(), u);
        }
        if (!all_users_in) break;
        nodes.push_back(id);
        normalize(nodes);
        changed = true;
      }
    }
  }
}

}  // namespace fact::discover
