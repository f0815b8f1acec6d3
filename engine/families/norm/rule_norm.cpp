// Row norms: LayerNorm and RMSNorm as ops, and both written out by hand
// (x * rsqrt(mean(x^2, -1, keepdim) + eps); (x - u) / sqrt(mean((x - u)^2, -1, keepdim) + eps)
// with u the row mean), optionally cast back and scaled by a weight (and a bias).
#include <algorithm>
#include <limits>
#include <map>

#include "discover/catalog.h"
#include "discover/epilogue.h"
#include "discover/views.h"

namespace fact::discover {

using ir::Arg;
using ir::Graph;
using ir::Node;
using ir::Op;
using ir::OpClass;

namespace {

Match norm_match(const Graph& g, const std::string& rule, int root, const std::string& kind, int x,
                 int out, std::vector<int> nodes, int weight, int bias, double eps,
                 const std::string& round_to = "") {
  Match m;
  m.rule = rule;
  m.family = Family::norm;
  m.root = root;
  m.anchors = {root};
  m.nodes = std::move(nodes);
  normalize(m.nodes);
  m.output = out;
  m.operands.push_back(Operand{"x", x, ""});
  if (weight >= 0) {
    m.operands.push_back(Operand{"weight", weight, "row"});
    m.epilogue.push_back("weight");
  }
  if (bias >= 0) {
    m.operands.push_back(Operand{"bias", bias, "row"});
    m.epilogue.push_back("bias");
  }
  const auto& xt = g.node(x).type();
  const int64_t cols = xt.rank() ? xt.shape.back() : 1;
  m.problem = {{"rows", cols ? xt.numel() / cols : 0}, {"cols", cols}};
  m.attrs = {{"kind", kind},
             {"eps", eps},
             {"dtype_in", ir::dtype_name(xt.dtype)},
             {"dtype_out", ir::dtype_name(g.node(out).type().dtype)}};
  // A hand-written norm that casts the normalised value before the weight multiply (Llama's
  // .type_as(x) * weight) rounds there; kernels must too.
  if (!round_to.empty()) m.attrs["round_to"] = round_to;
  return m;
}

int tensor_arg(const Node& n, int pos, const char* key) {
  const Arg* a = n.arg(pos, key);
  return a && a->is_node() ? a->node : -1;
}

// native_layer_norm(x, [C], None, None, eps) read only for its mean and rstd (a LayerNorm
// folded into the GEMMs after it, fact/folds.py): one pass over x writes the two f32 columns.
// An input cast to f32 that nothing else reads belongs to the pattern (the kernel converts).
Attempt match_row_stats(const Graph& g, const std::string& rule, int root, int x,
                        const std::map<int64_t, int>& by_index, int weight, int bias, double eps) {
  if (weight >= 0 || bias >= 0) {
    return miss(rule, root, root, 2, "native_layer_norm's statistics are used, but it has a weight or bias");
  }
  if (!by_index.count(1) || !by_index.count(2)) {
    return miss(rule, root, root, 2, "only one of native_layer_norm's mean and rstd is used");
  }
  const auto& mean_t = g.node(by_index.at(1)).type();
  if (mean_t.dtype != ir::DType::f32) {
    return miss(rule, root, by_index.at(1), 2, "the statistics are " + mean_t.str() + ", not f32");
  }
  std::vector<int> nodes = {root, by_index.at(1), by_index.at(2)};
  int input = x;
  const auto& xn = g.node(x);
  if (ir::op_class(xn.op) == OpClass::cast && xn.users.size() == 1 && !g.is_graph_output(x)) {
    nodes.push_back(x);
    input = first_operand(xn);
  }
  Match m = norm_match(g, rule, root, "layer_norm", input, by_index.at(1), nodes, -1, -1, eps);
  m.epilogue = {"stats"};  // what it writes: norm[stats]:bf16->f32:layer_norm
  m.attrs["stats"] = true;
  m.attrs["outputs"] = {g.node(by_index.at(1)).name, g.node(by_index.at(2)).name};
  Attempt a;
  a.matches.push_back(m);
  return a;
}

}  // namespace

Attempt match_norm_op(const Graph& g, int root) {
  const std::string rule = "norm";
  const auto& n = g.node(root);
  const int x = tensor_arg(n, 0, "input");
  if (x < 0) return miss(rule, root, root, 0, "the input is not a tensor");
  std::vector<int64_t> shape;
  if (!int_list(n.arg(1, "normalized_shape"), shape) || shape.size() != 1) {
    return miss(rule, root, root, 1, "only normalisation over the last dim is a row norm");
  }
  // rms_norm's eps=None is the float epsilon (ATen uses its opmath type's, f32 for 16-bit too).
  double eps = n.op == Op::rms_norm ? static_cast<double>(std::numeric_limits<float>::epsilon()) : 1e-5;
  const int weight = tensor_arg(n, 2, "weight");
  int bias = -1;
  if (n.op == Op::rms_norm) {
    if (const Arg* e = n.arg(3, "eps")) scalar_value(g, *e, eps);
  } else {
    bias = tensor_arg(n, 3, "bias");
    if (const Arg* e = n.arg(4, "eps")) scalar_value(g, *e, eps);
  }
  std::vector<int> nodes = {root};
  int out = root;
  if (n.op == Op::native_layer_norm) {
    // (out, mean, rstd): the normalised output, or the statistics alone.
    std::map<int64_t, int> by_index;
    for (int u : n.users) {
      const auto& gi = g.node(u);
      const Arg* idx = gi.arg(1);
      if (gi.op != Op::getitem || !idx || idx->kind != Arg::Kind::integer || by_index.count(idx->i)) {
        return miss(rule, root, u, 1, "native_layer_norm's result is read other than by one getitem per output");
      }
      by_index[idx->i] = u;
    }
    if (!by_index.count(0)) return match_row_stats(g, rule, root, x, by_index, weight, bias, eps);
    if (by_index.size() != 1) {
      return miss(rule, root, root, 1, "native_layer_norm's mean or rstd is used beside its output");
    }
    nodes.push_back(by_index[0]);
    out = by_index[0];
  }
  const std::string kind = n.op == Op::rms_norm ? "rms_norm" : "layer_norm";
  Attempt a;
  a.matches.push_back(norm_match(g, rule, root, kind, x, out, nodes, weight, bias, eps));
  return a;
}

namespace {

// What `id` averages when it is a mean over the last dim with keepdim=True (a row statistic of
// a hand-written norm); else -1.
int row_mean_input(const Graph& g, int id) {
  const auto& mean = g.node(id);
  std::vector<int64_t> dims;
  const Arg* keep = mean.arg(2, "keepdim");
  const int src = first_operand(mean);
  if (mean.op != Op::mean || src < 0 || !int_list(mean.arg(1, "dim"), dims) || dims.size() != 1 ||
      norm_dim(dims[0], g.node(src).type().rank()) != g.node(src).type().rank() - 1 || !keep ||
      keep->kind != Arg::Kind::boolean || !keep->b) {
    return -1;
  }
  return src;
}

// What `id` is the population variance of over the last dim, keepdim=True (x.var(-1,
// keepdim=True, unbiased=False), as aten.var.dim or aten.var.correction with correction 0); else -1.
int population_row_var(const Graph& g, int id) {
  const auto& n = g.node(id);
  const int src = first_operand(n);
  std::vector<int64_t> dims;
  if (n.op != Op::var || src < 0 || !int_list(n.arg(1, "dim"), dims) || dims.size() != 1 ||
      norm_dim(dims[0], g.node(src).type().rank()) != g.node(src).type().rank() - 1) {
    return -1;
  }
  const bool by_correction = n.target_op.find(".correction") != std::string::npos;
  const Arg* keep = by_correction ? n.arg(-1, "keepdim") : n.arg(3, "keepdim");
  if (!keep || keep->kind != Arg::Kind::boolean || !keep->b) return -1;
  if (by_correction) {
    const Arg* c = n.arg(-1, "correction");
    double v = 1;
    return c && scalar_value(g, *c, v) && v == 0 ? src : -1;
  }
  const Arg* unbiased = n.arg(2, "unbiased");
  return unbiased && unbiased->kind == Arg::Kind::boolean && !unbiased->b ? src : -1;
}

// The row vector (a weight or a bias, broadcast along the rows) that `id`, an `op` without an
// alpha, applies to `value`; else -1.
int row_vector_of(const Graph& g, int id, Op op, int value) {
  if (id < 0 || g.node(id).op != op || g.node(id).arg(2, "alpha")) return -1;
  for (int o : g.operands(g.node(id))) {
    if (o != value && g.node(o).outputs.size() == 1 && broadcast_kind(g.node(o).type(), g.node(id).type()) == "row") {
      return o;
    }
  }
  return -1;
}

// The norm's input: x, or what x casts where the cast belongs to the norm (Llama's x.float(),
// which nothing else reads; it joins `nodes` then). Otherwise the cast stays in PyTorch (or is
// an identity) and the norm reads its result.
int norm_input(const Graph& g, int x, std::vector<int>& nodes) {
  if (ir::op_class(g.node(x).op) != OpClass::cast || is_identity(g, g.node(x))) return x;
  absorb_chains(g, {{x}}, nodes);
  return std::find(nodes.begin(), nodes.end(), x) != nodes.end() ? first_operand(g.node(x)) : x;
}

// The one node reading `id`, when `id` is not also a graph output: a pattern that swallows `id`
// needs nobody else to need its value. Else -1.
int only_user(const Graph& g, int id) {
  return g.node(id).users.size() == 1 && !g.is_graph_output(id) ? g.node(id).users[0] : -1;
}

// A cast after the weight (and bias), where none came before it (Gemma's
// (x * rsqrt(..) * (1 + w.float())).type_as(x)): the kernel computes in f32 and writes the
// cast's dtype, so the cast joins the norm and `out` moves to it.
void absorb_trailing_cast(const Graph& g, int& out, std::vector<int>& nodes) {
  const int next = only_user(g, out);
  if (next >= 0 && ir::op_class(g.node(next).op) == OpClass::cast && !is_identity(g, g.node(next))) {
    nodes.push_back(next);
    out = next;
  }
}

}  // namespace

Attempt match_rms_norm_handwritten(const Graph& g, int root) {
  const std::string rule = "rms_norm_handwritten";
  const int src = row_mean_input(g, root);
  if (src < 0) return miss(rule, root, root, 0, "not a mean over the last dim with keepdim=True");
  // mean(x^2): pow(x, 2), x * x or square(x).
  const auto& sq = g.node(src);
  const auto sq_ops = g.operands(sq);
  double exponent = 0;
  const bool is_sq = (sq.op == Op::pow && sq_ops.size() == 1 && sq.arg(1, "exponent") &&
                      scalar_value(g, *sq.arg(1, "exponent"), exponent) && exponent == 2.0) ||
                     (sq.op == Op::mul && sq_ops.size() == 2 && sq_ops[0] == sq_ops[1]) ||
                     (sq.op == Op::square && sq_ops.size() == 1);
  if (!is_sq) return miss(rule, root, src, 1, "the mean is not of x squared");
  const int x = sq_ops[0];
  std::vector<int> nodes = {src, root};
  // + eps, then rsqrt and multiply, or sqrt and divide.
  if (only_user(g, src) != root) {
    return miss(rule, root, src, 1, "the square '" + sq.name + "' is also used outside the norm");
  }
  const int add = only_user(g, root);
  double eps = 0;
  if (add < 0 || g.node(add).op != Op::add || !g.node(add).arg(1, "other") ||
      !scalar_value(g, *g.node(add).arg(1, "other"), eps)) {
    return miss(rule, root, add < 0 ? root : add, 2, "the mean is not followed by + eps");
  }
  nodes.push_back(add);
  const int r = only_user(g, add);
  if (r < 0 || (g.node(r).op != Op::rsqrt && g.node(r).op != Op::sqrt)) {
    return miss(rule, root, r < 0 ? add : r, 3, "mean(x^2) + eps is not followed by rsqrt or sqrt");
  }
  nodes.push_back(r);
  const int scaled = only_user(g, r);
  const Op want = g.node(r).op == Op::rsqrt ? Op::mul : Op::div;
  const auto scaled_ops = scaled < 0 ? std::vector<int>{} : g.operands(g.node(scaled));
  // x itself, or what x widens exactly: T5 squares x.float() but multiplies x, promoted to f32.
  int x_exact = -1;
  if (ir::op_class(g.node(x).op) == OpClass::cast && !is_identity(g, g.node(x))) {
    const int from = first_operand(g.node(x));
    const auto narrow = from < 0 || g.node(from).outputs.size() != 1 ? ir::DType::other : g.node(from).type().dtype;
    if (g.node(x).type().dtype == ir::DType::f32 && (narrow == ir::DType::bf16 || narrow == ir::DType::f16)) {
      x_exact = from;
    }
  }
  auto is_x = [&](int o) { return o == x || (x_exact >= 0 && o == x_exact); };
  // x * rsqrt(...) in either order, but only x / sqrt(...): sqrt(...) / x is another function.
  const bool divides = want == Op::div;
  if (scaled < 0 || g.node(scaled).op != want || scaled_ops.size() != 2 ||
      !(is_x(scaled_ops[0]) || (!divides && is_x(scaled_ops[1]))) || (divides && scaled_ops[1] != r)) {
    return miss(rule, root, scaled < 0 ? r : scaled, 4,
                divides ? "x is not divided by the RMS" : "x is not multiplied by the reciprocal RMS");
  }
  nodes.push_back(scaled);
  int out = scaled;
  // Optional cast back (Llama's .type_as(x)).
  int next = only_user(g, out);
  std::string cast_to;
  if (next >= 0 && ir::op_class(g.node(next).op) == OpClass::cast && !g.is_graph_output(out)) {
    nodes.push_back(next);
    out = next;
    cast_to = ir::dtype_name(g.node(out).type().dtype);
    next = only_user(g, out);
  }
  const int input = norm_input(g, x, nodes);
  const int weight = row_vector_of(g, next, Op::mul, out);
  if (weight >= 0) {
    nodes.push_back(next);
    out = next;
  }
  if (cast_to.empty() && weight >= 0) absorb_trailing_cast(g, out, nodes);
  Attempt a;
  // The cast rounds before the weight only when a weight multiply follows it.
  const std::string round_to = weight >= 0 ? cast_to : "";
  a.matches.push_back(norm_match(g, rule, root, "rms_norm", input, out, nodes, weight, -1, eps, round_to));
  return a;
}

Attempt match_layer_norm_handwritten(const Graph& g, int root) {
  const std::string rule = "layer_norm_handwritten";
  const int x = row_mean_input(g, root);
  if (x < 0) return miss(rule, root, root, 0, "not a mean over the last dim with keepdim=True");
  // d = x - mean, written once or in both places it is used (BERT's (x - u).pow(2), (x - u) / ...)
  std::vector<int> centred;
  for (int u : g.node(root).users) {
    const auto& sub = g.node(u);
    const auto ops = g.operands(sub);
    const Arg* alpha = sub.arg(2, "alpha");
    double a = 1;
    if (sub.op != Op::sub || ops.size() != 2 || ops[0] != x || ops[1] != root ||
        (alpha && (!scalar_value(g, *alpha, a) || a != 1))) {
      return miss(rule, root, u, 1, "the mean is used other than as x - mean ('" + sub.name + "')");
    }
    centred.push_back(u);
  }
  if (centred.empty() || centred.size() > 2 || g.is_graph_output(root)) {
    return miss(rule, root, root, 1, "the mean is not subtracted from x");
  }
  // d is squared (for the variance) and normalised, or only normalised (the variance is
  // x.var(-1, unbiased=False)); normalised is d itself or d times the weight, first.
  int sq = -1, other = -1;
  for (int d : centred) {
    if (g.is_graph_output(d)) {
      return miss(rule, root, d, 2, "x - mean is used other than squared and normalised (an output)");
    }
    for (int u : g.node(d).users) {
      const auto& n = g.node(u);
      const auto ops = g.operands(n);
      double e = 0;
      const bool square = (n.op == Op::pow && ops.size() == 1 && n.arg(1, "exponent") &&
                           scalar_value(g, *n.arg(1, "exponent"), e) && e == 2.0) ||
                          (n.op == Op::mul && ops.size() == 2 && ops[0] == d && ops[1] == d) ||
                          (n.op == Op::square && ops.size() == 1);
      if (square && sq < 0) {
        sq = u;
      } else if ((n.op == Op::mul || n.op == Op::div) && other < 0 && ops.size() == 2 && ops[0] != ops[1] &&
                 (ops[0] == d || (n.op == Op::mul && ops[1] == d))) {
        other = u;
      } else {
        return miss(rule, root, u, 2, "x - mean is used other than squared and normalised ('" + n.name + "')");
      }
    }
  }
  if (other < 0) return miss(rule, root, root, 2, "x - mean is not normalised");
  // The variance: mean((x - u)^2, -1, keepdim) (BERT's), or x.var(-1, keepdim, unbiased=False).
  int var = -1;
  if (sq >= 0) {
    var = only_user(g, sq);
    if (var < 0 || row_mean_input(g, var) != sq) {
      return miss(rule, root, var < 0 ? sq : var, 3, "the square of x - mean is not averaged over the last dim");
    }
  } else {
    for (int u : g.node(x).users) {
      if (population_row_var(g, u) == x) var = u;
    }
    if (var < 0) return miss(rule, root, root, 3, "no variance of x: (x - mean)^2 averaged, or x.var(-1, unbiased=False)");
  }
  const int add = only_user(g, var);
  double eps = 0;
  if (add < 0 || g.node(add).op != Op::add || !g.node(add).arg(1, "other") ||
      !scalar_value(g, *g.node(add).arg(1, "other"), eps)) {
    return miss(rule, root, add < 0 ? var : add, 4, "the variance is not followed by + eps");
  }
  const int r = only_user(g, add);
  if (r < 0 || (g.node(r).op != Op::rsqrt && g.node(r).op != Op::sqrt)) {
    return miss(rule, root, r < 0 ? add : r, 5, "var + eps is not followed by rsqrt or sqrt");
  }
  const int scaled = only_user(g, r);
  // g * (x - u) / sqrt(var + eps): the weight multiplies first (the kernel multiplies after)
  int weight = -1, weighted = -1;
  if (scaled != other) {
    for (int o : g.operands(g.node(other))) {
      if (std::find(centred.begin(), centred.end(), o) != centred.end()) weight = row_vector_of(g, other, Op::mul, o);
    }
    if (weight < 0 || only_user(g, other) != scaled) {
      return miss(rule, root, other, 6, "x - mean is not normalised by the variance ('" + g.node(other).name + "')");
    }
    weighted = other;
  }
  const auto scaled_ops = scaled < 0 ? std::vector<int>{} : g.operands(g.node(scaled));
  // what is normalised: d times the weight, or d itself
  int numer = weighted;
  for (int o : scaled_ops) {
    if (numer < 0 && std::find(centred.begin(), centred.end(), o) != centred.end()) numer = o;
  }
  const Op want = g.node(r).op == Op::rsqrt ? Op::mul : Op::div;
  const bool fits = scaled >= 0 && g.node(scaled).op == want && scaled_ops.size() == 2 &&
                    (want == Op::div ? scaled_ops[0] == numer && scaled_ops[1] == r
                                     : (scaled_ops[0] == numer && scaled_ops[1] == r) ||
                                           (scaled_ops[0] == r && scaled_ops[1] == numer));
  if (!fits) {
    return miss(rule, root, scaled < 0 ? r : scaled, 6,
                want == Op::div ? "x - mean is not divided by sqrt(var + eps)"
                                : "x - mean is not multiplied by rsqrt(var + eps)");
  }
  std::vector<int> nodes = {root, var, add, r, scaled};
  nodes.insert(nodes.end(), centred.begin(), centred.end());
  if (sq >= 0) nodes.push_back(sq);
  if (weighted >= 0) nodes.push_back(weighted);
  int out = scaled;
  // Optional cast back, then weight and bias (row vectors), each in either operand order.
  int next = only_user(g, out);
  std::string cast_to;
  if (next >= 0 && ir::op_class(g.node(next).op) == OpClass::cast && !is_identity(g, g.node(next))) {
    nodes.push_back(next);
    out = next;
    cast_to = ir::dtype_name(g.node(out).type().dtype);
    next = only_user(g, out);
  }
  if (weight < 0) {
    weight = row_vector_of(g, next, Op::mul, out);
    if (weight >= 0) {
      nodes.push_back(next);
      out = next;
      next = only_user(g, out);
    }
  }
  const int bias = row_vector_of(g, next, Op::add, out);
  if (bias >= 0) {
    nodes.push_back(next);
    out = next;
  }
  if (cast_to.empty() && (weight >= 0 || bias >= 0)) absorb_trailing_cast(g, out, nodes);
  const int input = norm_input(g, x, nodes);
  Attempt a;
  a.matches.push_back(norm_match(g, rule, root, "layer_norm", input, out, nodes, weight, bias, eps,
                                 weight >= 0 || bias >= 0 ? cast_to : ""));
  return a;
}

}  // namespace fact::discover
