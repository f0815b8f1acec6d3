// Leftover pointwise regions: after the planner has chosen its patterns, the elementwise ops
// still left to PyTorch (RoPE's muls, negation and concatenation; a gate's activation and
// product) are grouped into regions one generated kernel computes in a single pass.
//
// A region grows backwards from its exit (a pointwise node no region has taken yet): a producer
// joins when it is a pointwise op, a cast, an identity, or a slice or concatenation along the
// last dim, and every one of its users is already in the region (so the region has one exit and
// nothing outside needs an intermediate value). Everything else the region reads is an operand,
// read in place through its strides. The region's value at an output index is an expression over
// the operands at that index (broadcast right-aligned), with the last-dim coordinate shifted by
// the slices and concatenations on the way: see families/pointwise/pointwise.h.
#include <algorithm>
#include <map>

#include "discover/catalog.h"
#include "discover/expr.h"
#include "discover/views.h"

namespace fact::discover {

using ir::Arg;
using ir::DType;
using ir::Graph;
using ir::Node;
using ir::Op;
using ir::OpClass;

namespace {

bool kernel_dtype(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16 || d == DType::boolean; }

// An integer argument, or `dflt` when it is absent or None; false for anything else (a symbol
// of a dynamic shape, a tensor): such a slice or concatenation is not an index function.
bool int_arg(const Arg* a, int64_t dflt, int64_t& out) {
  if (!a || a->kind == Arg::Kind::none) {
    out = dflt;
    return true;
  }
  if (a->kind != Arg::Kind::integer) return false;
  out = a->i;
  return true;
}

// A slice of the last dim with step 1: [start, start + length). Not one that narrows the last
// dim to a single column: that value broadcasts along the last dim (every column reads column
// `start`), which an index shift cannot express; left outside, it is a broadcast operand.
bool last_dim_slice(const Graph& g, const Node& n, int64_t& start, int64_t& length) {
  if (n.op != Op::slice || n.outputs.size() != 1) return false;
  const int src = first_operand(n);
  if (src < 0) return false;
  const auto& in = g.node(src).type();
  int64_t d = 0, step = 1;
  if (!int_arg(n.arg(1, "dim"), 0, d) || !int_arg(n.arg(4, "step"), 1, step) ||
      !int_arg(n.arg(2, "start"), 0, start)) {
    return false;
  }
  if (in.rank() == 0 || norm_dim(d, in.rank()) != in.rank() - 1 || step != 1) return false;
  const int64_t size = in.shape.back();
  if (start < 0) start += size;
  start = std::clamp<int64_t>(start, 0, size);
  length = n.type().shape.back();
  if (length == 1 && size != 1) return false;
  return start + length <= size;
}

// A concatenation along the last dim of tensors of the output's rank (wider than one column).
bool last_dim_cat(const Graph& g, const Node& n) {
  if (n.op != Op::cat || n.outputs.size() != 1) return false;
  const int rank = n.type().rank();
  int64_t d = 0;
  if (!int_arg(n.arg(1, "dim"), 0, d) || rank == 0 || norm_dim(d, rank) != rank - 1) return false;
  if (n.type().shape.back() <= 1) return false;
  const auto ops = g.operands(n);
  return !ops.empty() && std::all_of(ops.begin(), ops.end(), [&](int o) { return g.node(o).type().rank() == rank; });
}

// A pointwise or cast node the expression vocabulary can translate.
bool translatable(const Graph& g, const Node& n) {
  const auto cls = ir::op_class(n.op);
  if ((cls != OpClass::pointwise && cls != OpClass::cast) || n.outputs.size() != 1) return false;
  ExprGraph scratch;
  int result = -1;
  std::string why;
  auto leaf = [&](int) {
    Expr e;
    e.kind = Expr::Kind::operand;
    e.operand = 0;
    return scratch.add(e);
  };
  return node_to_expr(g, n, leaf, scratch, result, why);
}

enum class Role { none, compute, slice, cat, identity };

Role role_of(const Graph& g, const Node& n) {
  if (n.is_placeholder() || n.outputs.size() != 1 || !kernel_dtype(n.type().dtype)) return Role::none;
  // A node reading a tensor the kernels cannot load (an int64 index, say) stays in PyTorch; the
  // region around it stops there and reads its result instead.
  for (int o : g.operands(n)) {
    const auto& producer = g.node(o);
    if (producer.outputs.size() == 1 && !kernel_dtype(producer.type().dtype)) return Role::none;
  }
  int64_t start = 0, length = 0;
  if (last_dim_slice(g, n, start, length)) return Role::slice;
  if (last_dim_cat(g, n)) return Role::cat;
  if (is_identity(g, n) && first_operand(n) >= 0 &&
      g.node(first_operand(n)).type().shape == n.type().shape) {
    return Role::identity;
  }
  if (translatable(g, n)) return Role::compute;
  return Role::none;
}

}  // namespace

std::vector<Match> pointwise_regions(const Graph& g, const std::vector<char>& covered) {
  std::vector<Match> out;
  std::vector<char> taken(covered.begin(), covered.end());
  taken.resize(static_cast<size_t>(g.size()), 0);
  std::vector<Role> roles(static_cast<size_t>(g.size()), Role::none);
  for (const auto& n : g.nodes) roles[static_cast<size_t>(n.id)] = role_of(g, n);
  for (int exit = g.size() - 1; exit >= 0; --exit) {
    const Role r = roles[static_cast<size_t>(exit)];
    if (taken[static_cast<size_t>(exit)] || (r != Role::compute && r != Role::cat)) continue;
    const auto& out_type = g.node(exit).type();
    if (out_type.rank() == 0 || out_type.dtype == DType::boolean || out_type.numel() == 0) continue;
    // Grow backwards: program order puts every user after its producer.
    std::vector<char> in(static_cast<size_t>(g.size()), 0);
    in[static_cast<size_t>(exit)] = 1;
    for (int p = exit - 1; p >= 0; --p) {
      const auto& n = g.node(p);
      if (taken[static_cast<size_t>(p)] || roles[static_cast<size_t>(p)] == Role::none || n.users.empty() ||
          g.is_graph_output(p)) {
        continue;
      }
      if (std::all_of(n.users.begin(), n.users.end(), [&](int u) { return in[static_cast<size_t>(u)] != 0; })) {
        in[static_cast<size_t>(p)] = 1;
      }
    }
    std::vector<int> nodes;
    int computes = 0;
    for (int id = 0; id <= exit; ++id) {
      if (!in[static_cast<size_t>(id)]) continue;
      nodes.push_back(id);
      const Role role = roles[static_cast<size_t>(id)];
      computes += role == Role::compute || role == Role::cat;
    }
    if (computes < 2) continue;  // one op alone is what PyTorch runs already
    // The expression, in program order; operands are the tensors read from outside.
    Match m;
    m.rule = "pointwise_region";
    m.family = Family::pointwise;
    m.root = exit;
    m.anchors = {exit};
    m.output = exit;
    m.nodes = nodes;
    ExprGraph eg;
    std::map<int, int> expr;      // region node -> its Expr
    std::map<int, int> operand;   // outside node -> its operand Expr
    bool ok = true;
    std::string why;
    auto expr_of = [&](int id) -> int {
      if (in[static_cast<size_t>(id)]) return expr.at(id);
      auto it = operand.find(id);
      if (it != operand.end()) return it->second;
      Expr e;
      e.kind = Expr::Kind::operand;
      e.operand = static_cast<int>(m.operands.size());
      m.operands.push_back(Operand{"in" + std::to_string(m.operands.size()), id, ""});
      if (!kernel_dtype(g.node(id).type().dtype)) ok = false;
      return operand[id] = eg.add(e);
    };
    for (int id : nodes) {
      const auto& n = g.node(id);
      const Role role = roles[static_cast<size_t>(id)];
      Expr e;
      e.kind = Expr::Kind::fn;
      e.nodes = {id};
      if (role == Role::identity) {
        expr[id] = expr_of(first_operand(n));
      } else if (role == Role::slice) {
        int64_t start = 0, length = 0;
        last_dim_slice(g, n, start, length);
        e.fn = "slice_last";
        e.args = {expr_of(first_operand(n))};
        e.params = {static_cast<double>(start), static_cast<double>(length)};
        expr[id] = eg.add(e);
      } else if (role == Role::cat) {
        e.fn = "cat_last";
        for (int o : g.operands(n)) {
          e.args.push_back(expr_of(o));
          e.params.push_back(static_cast<double>(g.node(o).type().shape.back()));
        }
        expr[id] = eg.add(e);
      } else {
        int result = -1;
        ok = ok && node_to_expr(g, n, expr_of, eg, result, why);
        if (ok) expr[id] = result;
      }
      if (!ok) break;
    }
    if (!ok || m.operands.size() > 16 || out_type.rank() > 8) continue;
    eg.root = expr.at(exit);
    eg.compact();  // the root is the last entry (what realize evaluates)
    for (const auto& e : eg.exprs) {
      if (e.kind != Expr::Kind::fn) continue;
      m.epilogue.push_back(e.fn == "slice_last" ? "slice" : e.fn == "cat_last" ? "cat" : e.fn);
    }
    std::vector<std::string> names;
    std::string inputs;
    std::vector<std::string> access;  // how each operand's last dim is read, as traced
    nlohmann::json operand_strides = nlohmann::json::array();
    for (const auto& o : m.operands) {
      const auto& t = g.node(o.node).type();
      operand_strides.push_back(t.strides);
      access.push_back(t.rank() == 0 || t.shape.back() == 1 ? "broadcast"
                       : t.strides.back() == 1            ? "contiguous"
                                                          : "strided");
      names.push_back(g.node(o.node).name);
      const std::string dt = ir::dtype_name(g.node(o.node).type().dtype);
      if (inputs.find(dt) == std::string::npos) inputs += (inputs.empty() ? "" : ",") + dt;
    }
    m.epilogue_expr = {{"text", eg.to_text(names)}, {"ssa", eg.to_json()}};
    m.problem = {{"numel", out_type.numel()}, {"cols", out_type.shape.back()}};
    m.attrs = {{"inputs", inputs},
               {"access", access},
               {"operand_strides", operand_strides},
               {"dtype_out", ir::dtype_name(out_type.dtype)},
               {"shape", out_type.shape},
               {"strides", out_type.strides}};
    for (int id : nodes) taken[static_cast<size_t>(id)] = 1;
    out.push_back(std::move(m));
  }
  std::reverse(out.begin(), out.end());  // program order
  return out;
}

}  // namespace fact::discover
