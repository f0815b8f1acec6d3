#include "families/gemm/gemm_shape.h"

#include "discover/epilogue.h"
#include "discover/views.h"

namespace fact::discover {

using ir::Arg;
using ir::Graph;
using ir::Node;
using ir::NodeKind;
using ir::Op;
using ir::TensorType;

std::string matrix_layout(const TensorType& t) {
  if (t.rank() < 2) return "row";
  const auto r = static_cast<size_t>(t.rank());
  const int64_t rows = t.shape[r - 2], cols = t.shape[r - 1];
  const int64_t sr = t.strides[r - 2], sc = t.strides[r - 1];
  if ((sc == 1 || cols == 1) && sr >= cols) return "row";
  if ((sr == 1 || rows == 1) && sc >= rows) return "col";
  return "strided";
}

nlohmann::json gemm_attrs(const Graph& g, const GemmShape& s, int output) {
  return {{"layout_a", s.layout_a},
          {"layout_b", s.layout_b},
          {"dtype_a", ir::dtype_name(g.node(s.a).type().dtype)},
          {"dtype_b", ir::dtype_name(g.node(s.b).type().dtype)},
          {"dtype_out", ir::dtype_name(g.node(output).type().dtype)},
          {"accumulate", "f32"}};
}

namespace {

bool is_weight(const Graph& g, int id) {
  const auto& src = g.node(see_through(g, id).source);
  return src.kind == NodeKind::parameter || src.kind == NodeKind::buffer ||
         src.kind == NodeKind::constant;
}

// Can dims [begin, end) fold into one dim with a single stride? (The ABI has one leading dim
// and one batch stride per operand.) Size-1 dims never matter.
bool collapsible(const TensorType& t, size_t begin, size_t end) {
  int64_t inner = -1;  // stride the next outer dim must have, once a dim of size > 1 was seen
  for (size_t i = end; i-- > begin;) {
    if (t.shape[i] == 1) continue;
    if (inner >= 0 && t.strides[i] != inner) return false;
    inner = t.strides[i] * t.shape[i];
  }
  return true;
}

// Batch dims [0, r-2) of an operand, matching the output's and folding into one stride.
bool batch_ok(const TensorType& t, const TensorType& out) {
  const auto r = static_cast<size_t>(t.rank());
  const auto ro = static_cast<size_t>(out.rank());
  if (r != ro) return false;
  for (size_t i = 0; i + 2 < r; ++i) {
    if (t.shape[i] != out.shape[i]) return false;  // a broadcast batch dim: not one stride
  }
  return collapsible(t, 0, r - 2);
}

int64_t prod(const std::vector<int64_t>& v, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= v[i];
  return p;
}

Expr leaf(Expr::Kind kind, int operand = -1, int node = -1) {
  Expr e;
  e.kind = kind;
  e.operand = operand;
  if (node >= 0) e.nodes = {node};
  return e;
}

// seed = alpha * acc + beta * C (addmm/baddbmm) or acc + bias (linear).
void add_bias(const Graph& g, const Node& n, int bias_node, double alpha, double beta, GemmShape& s) {
  auto& e = s.seed;
  int acc = e.root;
  auto constant = [&](double v) {
    Expr c = leaf(Expr::Kind::constant);
    c.value = v;
    return e.add(c);
  };
  auto fn = [&](const char* name, int a, int b) {
    Expr x;
    x.kind = Expr::Kind::fn;
    x.fn = name;
    x.args = {a, b};
    x.nodes = {n.id};
    return e.add(x);
  };
  if (alpha != 1.0) acc = fn("mul", acc, constant(alpha));
  if (bias_node >= 0 && beta != 0.0) {
    Operand o;
    o.node = bias_node;
    o.role = g.node(bias_node).name;
    o.broadcast = broadcast_kind(g.node(bias_node).type(), n.type());
    s.seed_operands.push_back(o);
    int c = e.add(leaf(Expr::Kind::operand, static_cast<int>(s.seed_operands.size()) - 1, bias_node));
    if (beta != 1.0) c = fn("mul", c, constant(beta));
    acc = fn("add", acc, c);
  }
  e.root = acc;
}

}  // namespace

bool gemm_shape(const Graph& g, int node, GemmShape& s, std::string& why) {
  const Node& n = g.node(node);
  s = GemmShape{};
  s.seed.root = s.seed.add(leaf(Expr::Kind::acc, -1, node));
  auto tensor = [&](int pos, const char* key) -> int {
    const Arg* a = n.arg(pos, key);
    return a && a->is_node() ? a->node : -1;
  };
  auto scalar = [&](int pos, const char* key, double dflt) {
    const Arg* a = n.arg(pos, key);
    double v = dflt;
    if (a && a->kind != Arg::Kind::none) scalar_value(g, *a, v);
    return v;
  };
  if (n.outputs.size() != 1) {
    why = "has no single output";
    return false;
  }
  int bias = -1;
  double alpha = 1.0, beta = 1.0;
  switch (n.op) {
    case Op::mm:
    case Op::bmm:
    case Op::matmul:
      s.a = tensor(0, "self");
      s.b = tensor(1, "other");
      if (s.b < 0) s.b = tensor(1, "mat2");
      break;
    case Op::addmm:
    case Op::baddbmm:
      bias = tensor(0, "self");
      s.a = tensor(1, n.op == Op::addmm ? "mat1" : "batch1");
      s.b = tensor(2, n.op == Op::addmm ? "mat2" : "batch2");
      beta = scalar(-1, "beta", 1.0);
      alpha = scalar(-1, "alpha", 1.0);
      break;
    case Op::linear:
      s.a = tensor(0, "input");
      s.b = tensor(1, "weight");
      bias = tensor(2, "bias");
      break;
    default:
      why = "'" + n.target_op + "' is not a GEMM";
      return false;
  }
  if (s.a < 0 || s.b < 0) {
    why = "its matrix operands are not both tensors";
    return false;
  }
  const TensorType& A = g.node(s.a).type();
  const TensorType& B = g.node(s.b).type();
  const TensorType& O = n.type();
  if (A.rank() < 2 || B.rank() < 1 || (n.op != Op::linear && B.rank() < 2)) {
    why = "is a matrix-vector product (" + A.str() + " @ " + B.str() + "), not a GEMM";
    return false;
  }
  const auto ra = static_cast<size_t>(A.rank());
  s.k = A.shape[ra - 1];
  s.layout_a = matrix_layout(A);
  s.b_is_weight = is_weight(g, s.b);
  if (n.op == Op::linear) {
    if (B.rank() != 2) {
      why = "linear weight " + B.str() + " is not 2-D";
      return false;
    }
    s.n = B.shape[0];
    s.m = prod(A.shape, 0, ra - 1);
    // B = W^T: W [n, k] row-major is a column-major k x n matrix.
    TensorType wt = B;
    std::swap(wt.shape[0], wt.shape[1]);
    std::swap(wt.strides[0], wt.strides[1]);
    s.layout_b = matrix_layout(wt);
    s.b_transposed_weight = true;
    // Leading dims fold into m: they must collapse into one row dimension.
    if (A.rank() > 2 && !collapsible(A, 0, ra - 1)) s.layout_a = "strided";
  } else {
    const auto rb = static_cast<size_t>(B.rank());
    s.n = B.shape[rb - 1];
    if (B.shape[rb - 2] != s.k) {
      why = "inner dimensions differ (" + A.str() + " @ " + B.str() + ")";
      return false;
    }
    s.layout_b = matrix_layout(B);
    if (rb == 2) {
      s.m = prod(A.shape, 0, ra - 1);  // [.., m, k] @ [k, n]: leading dims fold into m
      if (A.rank() > 2 && !collapsible(A, 0, ra - 1)) s.layout_a = "strided";
    } else {
      s.m = A.shape[ra - 2];
      s.batch = prod(O.shape, 0, static_cast<size_t>(O.rank()) - 2);
      // One batch stride per operand: batch dims must match the output's and fold together.
      if (!batch_ok(A, O)) s.layout_a = "strided";
      if (!batch_ok(B, O)) s.layout_b = "strided";
    }
    const auto& bsrc = g.node(see_through(g, s.b).source);
    s.b_transposed_weight = s.b_is_weight && s.layout_b == "col" && bsrc.outputs.size() == 1 &&
                            bsrc.type().rank() == 2;
  }
  add_bias(g, n, bias, alpha, beta, s);
  return true;
}

}  // namespace fact::discover
