// GEMM + epilogue: one GEMM-class node and the pointwise tail after it (discover/epilogue.h).
#include <algorithm>

#include "discover/catalog.h"
#include "discover/epilogue.h"
#include "families/gemm/gemm_shape.h"
#include "ir/graph.h"

namespace fact::discover {

namespace {

// The tail node that first reads a second full-size operand, in program order, counting one the
// GEMM op itself reads (addmm's C); -1 if there is at most one (the GEMM kernel fetches one
// full tensor, CUTLASS's C).
int second_full_reader(const ir::Graph& g, int gemm, const Epilogue& ep) {
  std::vector<int> full;
  for (const auto& o : ep.operands) {
    if (o.broadcast == "full") full.push_back(o.node);
  }
  if (full.size() < 2) return -1;
  std::vector<int> readers = ep.nodes;  // the GEMM, then its tail in program order
  readers.push_back(gemm);
  std::sort(readers.begin(), readers.end());
  std::vector<int> seen;
  for (int id : readers) {
    for (int o : g.operands(g.node(id))) {
      if (std::count(full.begin(), full.end(), o) && !std::count(seen.begin(), seen.end(), o)) seen.push_back(o);
    }
    if (seen.size() > 1 && id != gemm) return id;
  }
  return -1;
}

Attempt match_gemm_epilogue_leaving(const ir::Graph& g, int root, const std::vector<char>* taken) {
  const std::string rule = "gemm_epilogue";
  GemmShape s;
  std::string why;
  if (!gemm_shape(g, root, s, why)) return miss(rule, root, root, 1, "'" + g.node(root).name + "' " + why);
  std::vector<char> leave = taken ? *taken : std::vector<char>(static_cast<size_t>(g.size()), 0);
  auto ep = grow_epilogue(g, root, s.seed, s.seed_operands, &leave);
  for (int second; (second = second_full_reader(g, root, ep)) >= 0;) {
    leave[static_cast<size_t>(second)] = kSecondFull;
    ep = grow_epilogue(g, root, s.seed, s.seed_operands, &leave);
  }
  Match m;
  m.rule = rule;
  m.family = Family::gemm;
  m.root = root;
  m.anchors = {root};
  m.nodes = ep.nodes;
  m.nodes.push_back(root);
  normalize(m.nodes);
  m.output = ep.output;
  m.operands = {Operand{"a", s.a, ""}, Operand{"b", s.b, ""}};
  for (const auto& o : ep.operands) m.operands.push_back(o);
  m.epilogue = ep.steps;
  m.epilogue_expr = {{"text", ep.text()}, {"ssa", ep.expr.to_json()}};
  m.problem = {{"batch", s.batch}, {"m", s.m}, {"n", s.n}, {"k", s.k}};
  m.attrs = gemm_attrs(g, s, ep.output);
  Attempt a;
  a.matches.push_back(m);
  // Where the tail stopped is worth knowing in `fact explain`.
  for (const auto& stop : ep.stops) a.misses.push_back(Miss{rule, root, root, 2, stop});
  return a;
}

}  // namespace

Attempt match_gemm_epilogue(const ir::Graph& g, int root) { return match_gemm_epilogue_leaving(g, root, nullptr); }

Attempt shrink_gemm_epilogue(const ir::Graph& g, int root, const std::vector<char>& taken) {
  return match_gemm_epilogue_leaving(g, root, &taken);
}

}  // namespace fact::discover
