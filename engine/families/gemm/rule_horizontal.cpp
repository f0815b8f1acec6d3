// Horizontal GEMM fusion: GEMMs that read the same A with weight B operands of the same K
// (q, k, v projections) become one pattern: one grouped GEMM over the parts' own weights.
#include <algorithm>

#include "discover/catalog.h"
#include "families/gemm/gemm_shape.h"
#include "discover/views.h"

namespace fact::discover {

namespace {

// One horizontal pattern: the GEMMs `ids` (first: `root`, whose shape is `s`) over one A.
Match horizontal_match(const ir::Graph& g, const std::string& rule, int root, const GemmShape& s,
                       const std::vector<int>& ids, const std::vector<GemmShape>& shapes) {
  Match m;
  m.rule = rule;
  m.family = Family::horizontal_gemm;
  m.root = root;
  m.nodes = ids;
  m.anchors = ids;
  normalize(m.nodes);
  m.output = root;
  m.operands.push_back(Operand{"a", s.a, ""});
  int64_t n_total = 0;
  bool bias = false;
  auto parts = nlohmann::json::array();
  for (const auto& t : shapes) {
    m.operands.push_back(Operand{"b", t.b, ""});
    for (const auto& o : t.seed_operands) {
      m.operands.push_back(Operand{"bias", o.node, o.broadcast});
      bias = true;
    }
    n_total += t.n;
    parts.push_back(t.n);
  }
  if (bias) m.epilogue.push_back("bias");
  m.problem = {{"batch", 1}, {"m", s.m}, {"n", n_total}, {"k", s.k}, {"n_parts", parts}};
  m.attrs = gemm_attrs(g, s, root);
  m.attrs["parts"] = nlohmann::json::array();
  for (int id : ids) m.attrs["parts"].push_back(g.node(id).name);
  return m;
}

}  // namespace

Attempt match_horizontal_gemm(const ir::Graph& g, int root) {
  const std::string rule = "horizontal_gemm";
  GemmShape s;
  std::string why;
  if (!gemm_shape(g, root, s, why)) return miss(rule, root, root, 1, "'" + g.node(root).name + "' " + why);
  if (s.batch != 1 || !s.b_is_weight) {
    return miss(rule, root, root, 1, "only GEMMs with a weight (parameter) B operand fuse horizontally");
  }
  const int a_src = skip_identity(g, s.a);
  std::vector<int> group;
  std::vector<GemmShape> shapes;
  // Siblings read A directly with the same M, K, weight layout and dtype.
  for (int cand : g.node(a_src).users) {
    GemmShape t;
    std::string w;
    if (ir::op_class(g.node(cand).op) != ir::OpClass::gemm || !gemm_shape(g, cand, t, w)) continue;
    if (skip_identity(g, t.a) != a_src || t.batch != 1 || !t.b_is_weight || t.k != s.k ||
        t.m != s.m || t.layout_b != s.layout_b ||
        g.node(t.b).type().dtype != g.node(s.b).type().dtype) {
      continue;
    }
    // Parts compute acc or acc + a row-vector bias (alpha = beta = 1): one bias row a part.
    const auto& seed = t.seed.exprs;
    const bool plain = seed.size() == 1;
    const bool biased = seed.size() == 3 && t.seed_operands.size() == 1 && t.seed_operands[0].broadcast == "row";
    if (!plain && !biased) continue;
    group.push_back(cand);
    shapes.push_back(t);
  }
  if (group.size() < 2) {
    return miss(rule, root, root, 2,
                "no other GEMM reads '" + g.node(a_src).name + "' with a weight of the same K");
  }
  if (std::find(group.begin(), group.end(), root) == group.end()) {
    return miss(rule, root, root, 2, "its own alpha/beta or a non-row bias does not fuse horizontally");
  }
  // A part whose output goes straight into pointwise math (GPT-J's fc_in into GELU beside q, k
  // and v) would leave that math to PyTorch in the group, where alone it is a GEMM epilogue: the
  // group without such parts is a second candidate, and the planner keeps what saves more.
  std::vector<int> plain_parts;
  std::vector<GemmShape> plain_shapes;
  for (size_t i = 0; i < group.size(); ++i) {
    const auto& users = g.node(group[i]).users;
    const bool tail = users.size() == 1 && !g.is_graph_output(group[i]) &&
                      (ir::op_class(g.node(users[0]).op) == ir::OpClass::pointwise ||
                       ir::op_class(g.node(users[0]).op) == ir::OpClass::cast);
    if (!tail) {
      plain_parts.push_back(group[i]);
      plain_shapes.push_back(shapes[i]);
    }
  }
  const bool subset = plain_parts.size() >= 2 && plain_parts.size() < group.size();
  const bool anchors_group = *std::min_element(group.begin(), group.end()) == root;
  const bool anchors_subset = subset && *std::min_element(plain_parts.begin(), plain_parts.end()) == root;
  if (!anchors_group && !anchors_subset) {
    return miss(rule, root, root, 2, "anchored at the group's first GEMM instead");
  }
  Attempt a;
  if (anchors_group) a.matches.push_back(horizontal_match(g, rule, root, s, group, shapes));
  if (anchors_subset) a.matches.push_back(horizontal_match(g, rule, root, s, plain_parts, plain_shapes));
  return a;
}

}  // namespace fact::discover
