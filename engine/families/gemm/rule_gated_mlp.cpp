// Gated MLP: act(A @ B1) * (A @ B2), the SwiGLU/GeGLU up-projection, as one GEMM over
// [B1 | B2] whose epilogue multiplies the activated half by the other half.
#include "discover/catalog.h"
#include "discover/epilogue.h"
#include "families/gemm/gemm_shape.h"
#include "discover/views.h"

namespace fact::discover {

namespace {

// The GEMM feeding `id` through pointwise nodes only, if exactly one does.
int gemm_source(const ir::Graph& g, int id, int depth = 0) {
  const auto& n = g.node(id);
  if (ir::op_class(n.op) == ir::OpClass::gemm) return id;
  const auto cls = ir::op_class(n.op);
  if (depth > 16 || !(cls == ir::OpClass::pointwise || cls == ir::OpClass::cast || is_identity(g, n))) {
    return -1;
  }
  int found = -1;
  for (int o : g.operands(n)) {
    const int src = gemm_source(g, o, depth + 1);
    if (src < 0 || (found >= 0 && src != found)) return -1;
    found = src;
  }
  return found;
}

}  // namespace

Attempt match_gated_mlp(const ir::Graph& g, int root) {
  const std::string rule = "gated_mlp";
  const auto& mul = g.node(root);
  const auto ops = g.operands(mul);
  if (ops.size() != 2) return miss(rule, root, root, 0, "the product is not of two tensors");
  std::string last_reason = "neither factor is act(A @ B1) with the other A @ B2";
  int progress = 0;
  for (int side = 0; side < 2; ++side) {
    const int act_out = ops[static_cast<size_t>(side)];
    const int lin = skip_identity(g, ops[static_cast<size_t>(1 - side)]);
    if (ir::op_class(g.node(lin).op) != ir::OpClass::gemm) continue;
    const int g1 = gemm_source(g, act_out);
    if (g1 < 0 || g1 == lin) continue;
    progress = std::max(progress, 2);
    if (g.node(act_out).users.size() != 1 || g.is_graph_output(act_out)) {
      last_reason = "the activation '" + g.node(act_out).name + "' is also used outside the product";
      continue;
    }
    std::vector<int> act_nodes;
    const auto act = activation_between(g, g1, act_out, act_nodes);
    if (act.empty()) {
      last_reason = "'" + g.node(act_out).name + "' is not a known activation of '" + g.node(g1).name + "'";
      continue;
    }
    GemmShape s1, s2;
    std::string why;
    if (!gemm_shape(g, g1, s1, why) || !gemm_shape(g, lin, s2, why)) {
      last_reason = why;
      continue;
    }
    progress = std::max(progress, 3);
    if (skip_identity(g, s1.a) != skip_identity(g, s2.a) || s1.k != s2.k || s1.n != s2.n ||
        s1.m != s2.m || s1.batch != 1 || s2.batch != 1 || !s1.b_is_weight || !s2.b_is_weight) {
      last_reason = "'" + g.node(g1).name + "' and '" + g.node(lin).name +
                    "' do not share A with weight operands of equal shape";
      continue;
    }
    if (g.node(lin).users.size() != 1 || g.is_graph_output(lin)) {
      last_reason = "'" + g.node(lin).name + "' is also used outside the product";
      continue;
    }
    if (!s1.seed_operands.empty() || !s2.seed_operands.empty()) {
      // Both gated forms (one gate GEMM computing act(acc) * up, or act(gate) * up after two
      // GEMMs) take bias-free projections: the GEMM rules plan these on their own instead.
      last_reason = "'" + g.node(g1).name + "' or '" + g.node(lin).name +
                    "' adds a bias, which the gated forms do not; the GEMMs are planned on their own";
      continue;
    }
    Match m;
    m.rule = rule;
    m.family = Family::gated_mlp;
    m.root = root;
    m.anchors = {g1, lin};
    m.nodes = act_nodes;
    for (int id : {g1, lin, root}) m.nodes.push_back(id);
    normalize(m.nodes);
    m.output = root;
    m.operands = {Operand{"a", s1.a, ""}, Operand{"b_gate", s1.b, ""}, Operand{"b_up", s2.b, ""}};
    m.epilogue.push_back(act);
    m.epilogue.push_back("mul");
    m.problem = {{"batch", 1}, {"m", s1.m}, {"n", s1.n}, {"k", s1.k}};
    m.attrs = gemm_attrs(g, s1, root);
    m.attrs["activation"] = act;
    m.attrs["gate"] = g.node(g1).name;
    m.attrs["up"] = g.node(lin).name;
    Attempt a;
    a.matches.push_back(m);
    return a;
  }
  return miss(rule, root, root, progress, last_reason);
}

}  // namespace fact::discover
