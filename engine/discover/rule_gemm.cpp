// GEMM + epilogue: one GEMM-class node and the pointwise tail after it (discover/epilogue.h).
#include "discover/catalog.h"
#include "discover/epilogue.h"
#include "discover/gemm_shape.h"
#include "ir/graph.h"

namespace fact::discover {


Attempt match_gemm_epilogue(const ir::Graph& g, int root) {
  const std::string rule = "gemm_epilogue";
  GemmShape s;
  std::string why;
  if (!gemm_shape(g, root, s, why)) return miss(rule, root, root, 1, "'" + g.node(root).name + "' " + why);
  const auto ep = grow_epilogue(g, root, s.seed, s.seed_operands);
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

}  // namespace fact::discover
