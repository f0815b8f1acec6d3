#include "discover/explain.h"

#include <algorithm>
#include <set>

#include "discover/catalog.h"
#include "discover/views.h"

namespace fact::discover {

using nlohmann::json;

namespace {

bool contains(const std::vector<int>& v, int x) { return std::binary_search(v.begin(), v.end(), x); }

json pattern_summary(const ir::Graph& g, const Candidate& c) {
  json nodes = json::array();
  for (int id : c.match.nodes) nodes.push_back(g.node(id).name);
  return {{"rule", c.match.rule},
          {"family", family_name(c.match.family)},
          {"root", g.node(c.match.root).name},
          {"nodes", nodes},
          {"epilogue", c.match.epilogue},
          {"est_saving_us", c.saving_s() * 1e6}};
}

// Distance in edges between two nodes, up to `limit` (undirected BFS).
int hops(const ir::Graph& g, int from, int to, int limit) {
  std::vector<int> frontier = {from};
  std::set<int> seen = {from};
  for (int d = 0; d <= limit; ++d) {
    std::vector<int> next;
    for (int x : frontier) {
      if (x == to) return d;
      std::vector<int> nbrs = g.operands(g.node(x));
      for (int u : g.node(x).users) nbrs.push_back(u);
      for (int y : nbrs) {
        if (seen.insert(y).second) next.push_back(y);
      }
    }
    frontier = std::move(next);
  }
  return limit + 1;
}

}  // namespace

json explain(const ir::Graph& g, const Discovery& d, int node) {
  const auto& n = g.node(node);
  json out;
  out["node"] = {{"name", n.name},
                 {"op", n.target_op},
                 {"class", ir::op_class_name(ir::op_class(n.op))},
                 {"type", n.outputs.size() == 1 ? n.type().str() : ""},
                 {"module", n.module}};
  out["covered_by"] = nullptr;
  for (size_t i = 0; i < d.chosen.size(); ++i) {
    if (contains(d.chosen[i].match.nodes, node)) {
      out["covered_by"] = pattern_summary(g, d.chosen[i]);
      out["covered_by"]["plan_index"] = i + 1;
    }
  }
  out["lost_candidates"] = json::array();
  for (size_t i = 0; i < d.rejected.size(); ++i) {
    if (!contains(d.rejected[i].match.nodes, node)) continue;
    auto s = pattern_summary(g, d.rejected[i]);
    s["why"] = d.rejected_why[i];
    out["lost_candidates"].push_back(s);
  }
  // Misses at this node or close to it, nearest (most progress, fewest hops) first.
  struct Ranked {
    const Miss* miss;
    int distance;
  };
  std::vector<Ranked> ranked;
  for (const auto& m : d.misses) {
    const int dist = std::min(hops(g, m.root, node, 3), hops(g, m.at, node, 3));
    if (dist <= 3) ranked.push_back({&m, dist});
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) {
    if (a.distance != b.distance) return a.distance < b.distance;
    return a.miss->progress > b.miss->progress;
  });
  out["misses"] = json::array();
  for (size_t i = 0; i < ranked.size() && i < 6; ++i) {
    const auto& m = *ranked[i].miss;
    out["misses"].push_back({{"rule", m.rule},
                             {"at", g.node(m.root).name},
                             {"stopped_at", g.node(m.at).name},
                             {"hops", ranked[i].distance},
                             {"reason", m.reason}});
  }
  std::vector<std::string> rooted;
  for (const auto& r : catalog()) {
    if (r.roots.count(n.op)) rooted.push_back(r.name);
  }
  out["rules_rooted_here"] = rooted;
  std::string note;
  if (n.is_placeholder()) {
    note = std::string("a graph ") + ir::node_kind_name(n.kind) + ": data, not computation";
  } else if (n.op == ir::Op::opaque) {
    note = "'" + n.target_op + "' is not in FACT's op vocabulary: it is kept as an opaque node and runs in PyTorch "
           "(if it is elementwise, `fact agent propose` can propose a lowering that FACT's checks may accept)";
  } else if (n.op == ir::Op::lowered) {
    note = "'" + n.target_op + "' is not in the catalog; it is read through an accepted lowering "
           "(`fact agent list`)";
  } else if (!is_compute(g, node) && out["covered_by"].is_null()) {
    note = "a view or identity: it launches no kernel, so leaving it to PyTorch costs nothing";
  } else if (out["covered_by"].is_null()) {
    note = "no chosen pattern covers it: it runs as the original PyTorch op";
  }
  out["note"] = note;
  return out;
}

}  // namespace fact::discover
