#include "discover/views.h"

namespace fact::discover {

using ir::Arg;
using ir::Graph;
using ir::Node;
using ir::Op;
using ir::OpClass;

int first_operand(const Node& n) {
  for (const auto& a : n.args) {
    if (a.is_node()) return a.node;
  }
  return -1;
}

bool is_identity(const Graph& g, const Node& n) {
  const int src = first_operand(n);
  if (src < 0 || n.outputs.size() != 1) return false;
  const auto& in = g.node(src);
  switch (n.op) {
    case Op::alias:
    case Op::detach:
    case Op::clone:
    case Op::lift_fresh_copy:
      return true;
    case Op::dropout: {
      const Arg* p = n.arg(1, "p");
      const Arg* train = n.arg(2, "train");
      const bool eval = train && train->kind == Arg::Kind::boolean && !train->b;
      return eval || (p && p->is_number() && p->number() == 0.0);
    }
    case Op::contiguous:
      return in.outputs.size() == 1 && in.type().is_contiguous();
    case Op::to_dtype:
    case Op::type_as:
      return in.outputs.size() == 1 && in.type().dtype == n.type().dtype;
    default:
      return false;
  }
}

bool is_view(const Node& n) {
  return ir::op_class(n.op) == OpClass::view && first_operand(n) >= 0;
}

Chain see_through(const Graph& g, int id, bool allow_casts) {
  Chain c;
  c.source = id;
  while (true) {
    const auto& n = g.node(c.source);
    const bool cast = allow_casts && ir::op_class(n.op) == OpClass::cast;
    const bool strided_copy = n.op == Op::contiguous;  // contiguous re-lays out; the kernel need not
    if (!(is_view(n) || is_identity(g, n) || cast || strided_copy)) break;
    c.nodes.push_back(c.source);
    c.source = first_operand(n);
  }
  return c;
}

int skip_identity(const Graph& g, int id) {
  while (is_identity(g, g.node(id))) id = first_operand(g.node(id));
  return id;
}

Chain follow_views(const Graph& g, int id) {
  Chain c;
  c.source = id;
  while (g.node(c.source).users.size() == 1 && !g.is_graph_output(c.source)) {
    const auto& u = g.node(g.node(c.source).users[0]);
    if (!(is_view(u) || is_identity(g, u) || u.op == Op::contiguous)) break;
    c.nodes.push_back(u.id);
    c.source = u.id;
  }
  return c;
}

bool scalar_value(const Graph& g, const Arg& a, double& out) {
  if (a.is_number()) {
    out = a.number();
    return true;
  }
  if (a.kind == Arg::Kind::boolean) {
    out = a.b ? 1.0 : 0.0;
    return true;
  }
  if (a.is_node()) {
    const auto& n = g.node(skip_identity(g, a.node));
    auto it = n.facts.find("value");
    if (it != n.facts.end()) {
      out = it->second;
      return true;
    }
  }
  return false;
}

bool int_list(const Arg* a, std::vector<int64_t>& out) {
  out.clear();
  if (!a) return false;
  if (a->kind == Arg::Kind::integer) {
    out.push_back(a->i);
    return true;
  }
  if (a->kind != Arg::Kind::list) return false;
  for (const auto& item : a->items) {
    if (item.kind != Arg::Kind::integer) return false;
    out.push_back(item.i);
  }
  return true;
}

int norm_dim(int64_t dim, int rank) { return static_cast<int>(dim < 0 ? dim + rank : dim); }

}  // namespace fact::discover
