#include "discover/epilogue.h"

#include <algorithm>
#include <map>
#include <set>

#include "discover/views.h"
#include "ir/error.h"

namespace fact::discover {

using ir::Graph;
using ir::Node;
using ir::Op;
using ir::OpClass;
using ir::TensorType;

namespace {

// A view that keeps the elements' order: a reshape of a contiguous tensor, or any view (a
// permute that moves only unit dims, as einsum's decomposition makes) whose input and output are
// both contiguous with as many elements. Its last dim may differ from the GEMM's columns on the
// way (einsum's (b, s, 1, n) -> (b, s, n, 1) -> (b, s, n)): see grow_epilogue.
bool shape_only_view(const Graph& g, const Node& n) {
  static const std::set<Op> flat = {Op::view,      Op::reshape, Op::unsafe_view, Op::view_as, Op::reshape_as,
                                    Op::flatten,   Op::unflatten, Op::squeeze,   Op::unsqueeze};
  if (n.outputs.size() != 1 || !(flat.count(n.op) || is_view(n))) return false;
  const auto& in = g.node(first_operand(n));
  if (in.outputs.size() != 1 || !in.type().is_contiguous() || n.type().rank() == 0) return false;
  return flat.count(n.op) || (n.type().is_contiguous() && n.type().numel() == in.type().numel());
}

// What the kernel reads for operand `o` of a node with output `out`: o itself, or, where o
// expands a dense tensor that already broadcasts against `out` (bias.expand_as(y)) and is read
// by nothing else, that tensor, which the kernel reads as a vector instead of a stride-0 full
// tensor. The expands on the way go to `chain` (they join the pattern).
int dense_source(const Graph& g, int o, const TensorType& out, std::vector<int>* chain = nullptr) {
  int src = o;
  std::vector<int> on_the_way;
  while (g.node(src).outputs.size() == 1 && (g.node(src).op == Op::expand || g.node(src).op == Op::expand_as) &&
         g.node(src).users.size() == 1 && !g.is_graph_output(src)) {
    on_the_way.push_back(src);
    src = first_operand(g.node(src));
  }
  const auto& n = g.node(src);
  if (src == o || n.outputs.size() != 1 || !n.type().is_contiguous() || broadcast_kind(n.type(), out).empty()) return o;
  if (chain) chain->insert(chain->end(), on_the_way.begin(), on_the_way.end());
  return src;
}

// Pass-through nodes: no Expr of their own.
bool pass_through(const Graph& g, const Node& n) {
  return is_identity(g, n) || shape_only_view(g, n);
}

// Can `n` be translated to an epilogue function at all? (Dry run on a scratch graph.)
bool translatable(const Graph& g, const Node& n, std::string& why) {
  const auto cls = ir::op_class(n.op);
  if (cls != OpClass::pointwise && cls != OpClass::cast) {
    why = "'" + n.target_op + "' is not a pointwise op";
    return false;
  }
  ExprGraph scratch;
  Expr leaf;
  leaf.kind = Expr::Kind::acc;
  const int x = scratch.add(leaf);
  int result = -1;
  return node_to_expr(g, n, [x](int) { return x; }, scratch, result, why);
}

bool dense_vector(const Graph& g, int node, const TensorType& out) {
  const auto& n = g.node(node);
  if (n.outputs.size() != 1 || !n.type().is_contiguous()) return false;
  const std::string kind = broadcast_kind(n.type(), out);
  return kind == "scalar" || kind == "row" || kind == "col";
}

// Try to take `node` (and the side nodes it reads) as a side computation for a region node of
// type `out`: pointwise, independent of the GEMM, and in the end reading only dense scalars,
// row and column vectors. Appends what it takes to `taken`; false (taking nothing) otherwise.
bool take_side(const Graph& g, int node, const TensorType& out, const std::vector<char>& down,
               std::vector<int>& taken) {
  const auto& n = g.node(node);
  std::string why;
  if (down[static_cast<size_t>(node)] || n.outputs.size() != 1 || !translatable(g, n, why) ||
      broadcast_kind(n.type(), out).empty()) {
    return false;
  }
  const size_t mark = taken.size();
  taken.push_back(node);
  for (int o : g.operands(n)) {
    if (std::find(taken.begin(), taken.end(), o) != taken.end() || dense_vector(g, o, out)) continue;
    if (!take_side(g, o, out, down, taken)) {
      taken.resize(mark);
      return false;
    }
  }
  return true;
}

}  // namespace

std::vector<int> side_computations(const Graph& g, int gemm, const std::vector<char>& region,
                                   const std::vector<char>& down) {
  std::vector<int> side;
  auto in = [&](int id) {
    return region[static_cast<size_t>(id)] || std::find(side.begin(), side.end(), id) != side.end();
  };
  for (int v = 0; v < static_cast<int>(region.size()); ++v) {
    if (!region[static_cast<size_t>(v)] || v == gemm) continue;  // the GEMM's own operands are A and B
    const auto& n = g.node(v);
    for (int o : g.operands(n)) {
      if (in(o) || n.outputs.size() != 1 || broadcast_kind(g.node(o).type(), n.type()) != "full") continue;
      std::vector<int> taken;
      if (!take_side(g, o, n.type(), down, taken)) continue;
      bool kept = true;  // every user of what it takes is in the region or taken
      for (int t : taken) {
        for (int u : g.node(t).users) {
          kept = kept && (in(u) || std::find(taken.begin(), taken.end(), u) != taken.end());
        }
        kept = kept && !g.is_graph_output(t);
      }
      if (kept) side.insert(side.end(), taken.begin(), taken.end());
    }
  }
  std::sort(side.begin(), side.end());
  side.erase(std::unique(side.begin(), side.end()), side.end());
  return side;
}

int side_reader(const Graph& g, const std::vector<char>& region, const std::vector<int>& side, int node) {
  // The first region node reached from `node` through side nodes: its type classifies leaves.
  for (int u : g.node(node).users) {
    if (region[static_cast<size_t>(u)]) return u;
    if (std::binary_search(side.begin(), side.end(), u)) return side_reader(g, region, side, u);
  }
  internal_error(__FILE__, __LINE__, "epilogue side node '" + g.node(node).name + "' reaches no region node");
}

std::string broadcast_kind(const TensorType& operand, const TensorType& out) {
  if (operand.numel() == 1) return "scalar";
  const int ro = out.rank();
  const int rt = operand.rank();
  if (rt > ro || ro == 0) return "";
  auto dim = [&](int i) -> int64_t {  // operand dim aligned to output dim i
    const int j = i - (ro - rt);
    return j < 0 ? 1 : operand.shape[static_cast<size_t>(j)];
  };
  bool full = true, row = true, col = true;
  for (int i = 0; i < ro; ++i) {
    const int64_t o = out.shape[static_cast<size_t>(i)];
    const int64_t t = dim(i);
    full = full && t == o;
    if (i == ro - 1) {
      row = row && t == o;
      col = col && t == 1;
    } else {
      row = row && t == 1;
      col = col && t == o;
    }
  }
  if (full) return "full";
  if (row) return "row";
  if (col) return "col";
  return "";
}

std::string Epilogue::text() const {
  std::vector<std::string> names;
  for (const auto& o : operands) names.push_back(o.role);
  return expr.to_text(names);
}

void fold_activations(ExprGraph& e) {
  const int n = static_cast<int>(e.exprs.size());
  auto at = [&](int i) -> Expr& { return e.exprs[static_cast<size_t>(i)]; };
  std::vector<std::vector<int>> users(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    for (int a : at(i).args) users[static_cast<size_t>(a)].push_back(i);
  }
  // Immediate dominators, with the accumulator and operands hanging off a virtual root (-1);
  // constants take no part (-2).
  std::vector<int> idom(static_cast<size_t>(n), -2), depth(static_cast<size_t>(n), 0);
  auto lca = [&](int a, int b) {
    while (a != b) {
      if (a == -1 || b == -1) return -1;
      if (depth[static_cast<size_t>(a)] >= depth[static_cast<size_t>(b)]) {
        a = idom[static_cast<size_t>(a)];
      } else {
        b = idom[static_cast<size_t>(b)];
      }
    }
    return a;
  };
  for (int i = 0; i < n; ++i) {
    const auto& x = at(i);
    if (x.kind == Expr::Kind::acc || x.kind == Expr::Kind::operand) {
      idom[static_cast<size_t>(i)] = -1;
      depth[static_cast<size_t>(i)] = 1;
    } else if (x.kind == Expr::Kind::fn) {
      int d = -2;
      for (int a : x.args) {
        if (idom[static_cast<size_t>(a)] == -2) continue;
        d = d == -2 ? a : lca(d, a);
      }
      idom[static_cast<size_t>(i)] = d;
      depth[static_cast<size_t>(i)] = d < 0 ? 1 : depth[static_cast<size_t>(d)] + 1;
    }
  }
  struct Fold {
    int u, v;
    std::string name;
    std::vector<int> inner;
  };
  std::vector<Fold> folds;
  std::vector<char> consumed(static_cast<size_t>(n), 0);
  for (int v = n - 1; v >= 0; --v) {
    if (at(v).kind != Expr::Kind::fn || consumed[static_cast<size_t>(v)] || idom[static_cast<size_t>(v)] < 0) {
      continue;
    }
    std::vector<int> chain;
    for (int u = idom[static_cast<size_t>(v)]; u >= 0; u = idom[static_cast<size_t>(u)]) chain.push_back(u);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const int u = *it;
      // Nodes on paths u -> v.
      std::vector<char> from_u(static_cast<size_t>(n), 0), to_v(static_cast<size_t>(n), 0);
      from_u[static_cast<size_t>(u)] = 1;
      for (int w = u + 1; w <= v; ++w) {
        for (int a : at(w).args) from_u[static_cast<size_t>(w)] |= from_u[static_cast<size_t>(a)];
      }
      to_v[static_cast<size_t>(v)] = 1;
      for (int w = v; w > u; --w) {
        if (!to_v[static_cast<size_t>(w)]) continue;
        for (int a : at(w).args) to_v[static_cast<size_t>(a)] = 1;
      }
      std::vector<int> inner;
      for (int w = u + 1; w <= v; ++w) {
        if (from_u[static_cast<size_t>(w)] && to_v[static_cast<size_t>(w)]) inner.push_back(w);
      }
      if (inner.size() < 2) continue;  // a single op keeps the name it was written with
      bool closed = true;
      for (int w : inner) {
        closed = closed && !consumed[static_cast<size_t>(w)];
        if (w == v) continue;
        for (int user : users[static_cast<size_t>(w)]) {
          closed = closed && std::binary_search(inner.begin(), inner.end(), user);
        }
      }
      if (!closed) continue;
      auto name = fingerprint_activation(e, u, v);
      if (name.empty()) continue;
      for (int w : inner) consumed[static_cast<size_t>(w)] = 1;
      folds.push_back({u, v, name, inner});
      break;
    }
  }
  if (folds.empty()) return;
  std::map<int, const Fold*> by_root;
  std::vector<char> skip(static_cast<size_t>(n), 0);
  for (const auto& f : folds) {
    by_root[f.v] = &f;
    for (int w : f.inner) skip[static_cast<size_t>(w)] = w != f.v;
  }
  ExprGraph out;
  std::vector<int> remap(static_cast<size_t>(n), -1);
  for (int i = 0; i < n; ++i) {
    if (skip[static_cast<size_t>(i)]) continue;
    auto f = by_root.find(i);
    if (f != by_root.end()) {
      Expr folded;
      folded.kind = Expr::Kind::fn;
      folded.fn = f->second->name;
      folded.folded = true;
      folded.args = {remap[static_cast<size_t>(f->second->u)]};
      for (int w : f->second->inner) {
        for (int node : at(w).nodes) folded.nodes.push_back(node);
      }
      std::sort(folded.nodes.begin(), folded.nodes.end());
      folded.nodes.erase(std::unique(folded.nodes.begin(), folded.nodes.end()), folded.nodes.end());
      remap[static_cast<size_t>(i)] = out.add(folded);
      continue;
    }
    Expr copy = at(i);
    for (int& a : copy.args) a = remap[static_cast<size_t>(a)];
    remap[static_cast<size_t>(i)] = out.add(copy);
  }
  out.root = remap[static_cast<size_t>(e.root)];
  out.compact();
  e = std::move(out);
}

std::vector<std::string> name_steps(const Graph& g, const ExprGraph& e,
                                    const std::vector<Operand>& operands) {
  std::vector<std::string> steps;
  // What an argument is made of: an operand's broadcast kind (also through functions of that
  // operand and constants, like beta * bias), "constant", or "" when it depends on acc.
  std::vector<std::string> kind(e.exprs.size());
  for (size_t i = 0; i < e.exprs.size(); ++i) {
    const auto& x = e.exprs[i];
    if (x.kind == Expr::Kind::constant) {
      kind[i] = "constant";
    } else if (x.kind == Expr::Kind::operand) {
      kind[i] = operands[static_cast<size_t>(x.operand)].broadcast;
    } else if (x.kind == Expr::Kind::fn) {
      std::string k = "constant";
      for (int a : x.args) {
        const auto& ka = kind[static_cast<size_t>(a)];
        if (ka.empty() || (k != "constant" && ka != "constant" && ka != k)) {
          k = "";
          break;
        }
        if (ka != "constant") k = ka;
      }
      kind[i] = k;
    }
  }
  auto operand_bcast = [&](int arg) { return kind[static_cast<size_t>(arg)]; };
  std::set<int> lowered;  // a lowered op is one step, named by its ATen op, however many functions
  for (const auto& x : e.exprs) {
    if (x.kind != Expr::Kind::fn || x.fn == "cast") continue;
    if (!x.folded && x.nodes.size() == 1 && g.node(x.nodes[0]).op == ir::Op::lowered) {
      if (lowered.insert(x.nodes[0]).second) steps.push_back(ir::aten_base(g.node(x.nodes[0]).target_op));
      continue;
    }
    std::set<std::string> kinds;
    for (int a : x.args) kinds.insert(operand_bcast(a));
    std::string name;
    if (x.folded || x.fn == "gelu_erf" || x.fn == "gelu_tanh") {
      name = x.fn;
    } else if (x.fn == "add" && kinds.count("row")) {
      name = "bias";
    } else if (x.fn == "add" && kinds.count("full")) {
      name = "residual";
    } else if ((x.fn == "mul" || x.fn == "div") && (kinds.count("constant") || kinds.count("scalar"))) {
      name = "scale";
    } else if (!x.nodes.empty() && ir::op_class(g.node(x.nodes[0]).op) == OpClass::pointwise) {
      name = std::string(ir::op_name(g.node(x.nodes[0]).op));
    } else {
      name = x.fn;
    }
    steps.push_back(name);
  }
  return steps;
}

Epilogue grow_epilogue(const Graph& g, int gemm, ExprGraph seed, std::vector<Operand> seed_operands,
                       const std::vector<char>* taken) {
  Epilogue ep;
  ep.output = gemm;
  ep.expr = std::move(seed);
  ep.operands = std::move(seed_operands);
  const auto& G = g.node(gemm);
  const int64_t n_cols = G.type().rank() ? G.type().shape.back() : 1;
  const int total = g.size();
  std::vector<char> down(static_cast<size_t>(total), 0), cand(static_cast<size_t>(total), 0);
  std::vector<char> folded(static_cast<size_t>(total), 0);  // views not ending in n_cols
  down[static_cast<size_t>(gemm)] = 1;
  auto in_region = [&](int id) { return id == gemm || cand[static_cast<size_t>(id)]; };

  // 1. Candidates: every node reached from the GEMM through absorbable nodes.
  for (int id = gemm + 1; id < total; ++id) {
    const auto& n = g.node(id);
    const auto ops = g.operands(n);
    bool reads_region = false;
    for (int o : ops) {
      down[static_cast<size_t>(id)] |= down[static_cast<size_t>(o)];
      reads_region = reads_region || in_region(o);
    }
    if (!reads_region) continue;
    std::string why;
    const bool passes = pass_through(g, n);
    bool ok = passes || translatable(g, n, why);
    if (taken && (*taken)[static_cast<size_t>(id)]) {
      ok = false;
      why = (*taken)[static_cast<size_t>(id)] == kSecondFull
                ? "it reads a second full-size tensor (the kernel reads one, as C)"
                : "another pattern computes it";
    }
    if (ok && (n.outputs.size() != 1 || n.type().numel() != G.type().numel())) {
      ok = false;  // broadcasting the GEMM result up (or down) is not an epilogue
      why = "its output " + (n.outputs.size() == 1 ? n.type().str() : std::string("?")) +
            " does not have the GEMM's shape " + G.type().str();
    } else if (ok && n.type().shape.back() != n_cols) {
      // A view on the way to the GEMM's shape may have another last dim; it can be neither the
      // result nor the input of a computation, whose operands broadcast against that dim.
      ok = passes;
      folded[static_cast<size_t>(id)] = 1;
      why = "its output " + n.type().str() + " does not end in the GEMM's " +
            std::to_string(n_cols) + " columns";
    }
    for (int o : ops) {
      if (ok && !passes && folded[static_cast<size_t>(o)]) {
        ok = false;
        why = "it reads '" + g.node(o).name + "', a view whose last dim is not the GEMM's columns";
      }
    }
    for (int read : ops) {
      if (!ok || in_region(read)) continue;
      const int o = n.outputs.size() == 1 ? dense_source(g, read, n.type()) : read;
      if (down[static_cast<size_t>(o)]) {
        ok = false;
        why = "it also reads '" + g.node(o).name + "', which depends on the GEMM by another path";
      } else if (g.node(o).outputs.size() == 1 && !g.node(o).type().is_contiguous()) {
        // The kernel reads operands densely (vectors with unit stride, full tensors row-major).
        ok = false;
        why = "its operand '" + g.node(o).name + "' is a strided view (not contiguous)";
      } else if (g.node(o).outputs.size() != 1 || n.outputs.size() != 1 ||
                 broadcast_kind(g.node(o).type(), n.type()).empty()) {
        ok = false;
        why = "its operand '" + g.node(o).name + "' " +
              (g.node(o).outputs.size() == 1 ? g.node(o).type().str() : std::string("?")) +
              " is not a scalar, row vector, column vector or full tensor of the output's shape";
      }
    }
    if (ok) {
      cand[static_cast<size_t>(id)] = 1;
    } else {
      ep.stops.push_back("stops before '" + n.name + "': " + why);
    }
  }

  // 2. The farthest sink whose region has a single exit.
  std::vector<char> region(static_cast<size_t>(total), 0);
  int sink = -1;
  for (int s = total - 1; s > gemm && sink < 0; --s) {
    if (!cand[static_cast<size_t>(s)] || folded[static_cast<size_t>(s)]) continue;
    std::fill(region.begin(), region.end(), 0);
    region[static_cast<size_t>(s)] = 1;
    for (int v = s; v >= gemm; --v) {
      if (!region[static_cast<size_t>(v)] || v == gemm) continue;
      for (int o : g.operands(g.node(v))) {
        if (in_region(o)) region[static_cast<size_t>(o)] = 1;
      }
    }
    bool single_exit = region[static_cast<size_t>(gemm)];
    for (int v = gemm; v < s && single_exit; ++v) {
      if (!region[static_cast<size_t>(v)]) continue;
      if (g.is_graph_output(v)) single_exit = false;
      for (int u : g.node(v).users) single_exit = single_exit && region[static_cast<size_t>(u)];
    }
    if (single_exit) sink = s;
  }
  if (sink < 0) {
    for (int u : G.users) {
      if (!cand[static_cast<size_t>(u)]) continue;
      ep.stops.push_back("no epilogue: the GEMM's output is also read outside any pointwise tail");
      break;
    }
    ep.expr.compact();
    ep.steps = name_steps(g, ep.expr, ep.operands);
    return ep;
  }

  // 3. Side computations. An operand that is itself a pointwise function of scalars, row and
  //    column vectors (an outer product such as mean * c1, or sa[:, None] * sb[None, :]) would
  //    be a full tensor that PyTorch writes and the kernel reads back; the epilogue computes it
  //    from the vectors instead. Taken only where every user of the side nodes is in the region,
  //    so that replacing the region removes them.
  const std::vector<int> side = side_computations(g, gemm, region, down);

  // 4. Translate the region to an expression over acc.
  std::map<int, int> expr_of{{gemm, ep.expr.root}};
  auto operand_expr = [&](int node, const Node& user) {
    for (size_t k = 0; k < ep.operands.size(); ++k) {
      if (ep.operands[k].node == node) {
        for (size_t x = 0; x < ep.expr.exprs.size(); ++x) {
          const auto& e = ep.expr.exprs[x];
          if (e.kind == Expr::Kind::operand && e.operand == static_cast<int>(k)) return static_cast<int>(x);
        }
      }
    }
    Operand o;
    o.node = node;
    o.role = g.node(node).name;
    o.broadcast = broadcast_kind(g.node(node).type(), user.type());
    ep.operands.push_back(o);
    Expr leaf;
    leaf.kind = Expr::Kind::operand;
    leaf.operand = static_cast<int>(ep.operands.size()) - 1;
    leaf.nodes = {node};
    return ep.expr.add(leaf);
  };
  // Node v into the expression; its leaves classified against `reader`'s output.
  auto translate = [&](int v, const Node& reader) {
    const auto& n = g.node(v);
    ep.nodes.push_back(v);
    int result = -1;
    std::string why;
    const bool ok = node_to_expr(
        g, n,
        [&](int node) {
          auto it = expr_of.find(node);
          if (it != expr_of.end()) return it->second;
          std::vector<int> expands;
          const int read = dense_source(g, node, reader.type(), &expands);
          for (int x : expands) {
            if (std::find(ep.nodes.begin(), ep.nodes.end(), x) == ep.nodes.end()) ep.nodes.push_back(x);
          }
          return operand_expr(read, reader);
        },
        ep.expr, result, why);
    FACT_CHECK(ok, "epilogue node '" + n.name + "' passed the dry run but failed: " + why);
    expr_of[v] = result;
  };
  // Side nodes first (they read no part of the region), against the region node reading them.
  for (int v : side) translate(v, g.node(side_reader(g, region, side, v)));
  for (int v = gemm + 1; v <= sink; ++v) {
    if (!region[static_cast<size_t>(v)]) continue;
    const auto& n = g.node(v);
    if (pass_through(g, n)) {
      ep.nodes.push_back(v);
      expr_of[v] = expr_of.at(first_operand(n));
      continue;
    }
    translate(v, n);
  }
  ep.output = sink;
  ep.expr.root = expr_of.at(sink);
  ep.expr.compact();
  fold_activations(ep.expr);
  ep.steps = name_steps(g, ep.expr, ep.operands);
  return ep;
}

std::string activation_between(const Graph& g, int input, int output, std::vector<int>& nodes) {
  nodes.clear();
  if (output == input) return "";
  std::vector<char> from(static_cast<size_t>(g.size()), 0);
  from[static_cast<size_t>(input)] = 1;
  for (int v = input + 1; v <= output; ++v) {
    for (int o : g.operands(g.node(v))) from[static_cast<size_t>(v)] |= from[static_cast<size_t>(o)];
    if (from[static_cast<size_t>(v)]) nodes.push_back(v);
  }
  // Every node on the way must be pointwise, read only the chain and constants, and be used
  // only inside the chain.
  ExprGraph e;
  Expr leaf;
  leaf.kind = Expr::Kind::acc;
  std::map<int, int> expr_of{{input, e.add(leaf)}};
  std::vector<int> kept;
  for (int v : nodes) {
    const auto& n = g.node(v);
    for (int o : g.operands(n)) {
      if (!expr_of.count(o)) return "";
    }
    if (v != output) {
      for (int u : n.users) {
        if (u > output || !from[static_cast<size_t>(u)]) return "";
      }
    }
    kept.push_back(v);
    if (is_identity(g, n)) {
      expr_of[v] = expr_of.at(first_operand(n));
      continue;
    }
    int result = -1;
    std::string why;
    if (!node_to_expr(g, n, [&](int node) { return expr_of.at(node); }, e, result, why)) return "";
    expr_of[v] = result;
  }
  if (!expr_of.count(output)) return "";
  for (int u : g.node(input).users) {
    if (!std::binary_search(kept.begin(), kept.end(), u)) return "";
  }
  nodes = kept;
  e.root = expr_of.at(output);
  const auto& root = e.exprs[static_cast<size_t>(e.root)];
  static const std::set<std::string> activations = {"relu", "silu", "sigmoid", "tanh", "gelu_erf",
                                                    "gelu_tanh", "mish", "leaky_relu", "hardswish",
                                                    "softplus", "elu", "hardtanh", "clamp"};
  if (nodes.size() == 1 && root.kind == Expr::Kind::fn && activations.count(root.fn)) return root.fn;
  return fingerprint_activation(e, 0, e.root);
}

}  // namespace fact::discover
