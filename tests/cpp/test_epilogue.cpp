// GEMM epilogues: recognising activations by value, broadcast classes, and growing the
// pointwise tail after a GEMM into named steps.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "discover/epilogue.h"
#include "discover/expr.h"
#include "families/gemm/gemm_shape.h"
#include "graph_builder.h"

namespace fact::test {
namespace {

using discover::Epilogue;
using discover::Expr;
using discover::ExprGraph;
using Steps = std::vector<std::string>;

// ---------------------------------------------------------------------------------------------
// Hand-built expression graphs

struct ExprBuilder {
  ExprGraph g;
  int x = -1;
  ExprBuilder() {
    Expr e;
    e.kind = Expr::Kind::acc;
    x = g.add(e);
  }
  int c(double v) {
    Expr e;
    e.kind = Expr::Kind::constant;
    e.value = v;
    return g.add(e);
  }
  int operand(int index) {
    Expr e;
    e.kind = Expr::Kind::operand;
    e.operand = index;
    return g.add(e);
  }
  int fn(const std::string& name, std::vector<int> args, std::vector<double> params = {}) {
    Expr e;
    e.kind = Expr::Kind::fn;
    e.fn = name;
    e.args = std::move(args);
    e.params = std::move(params);
    return g.add(e);
  }
  int mul(int a, int b) { return fn("mul", {a, b}); }
  int add(int a, int b) { return fn("add", {a, b}); }
  std::string fingerprint(int out) { return discover::fingerprint_activation(g, x, out); }
};

// 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * cube)))
int gelu_tanh_of(ExprBuilder& b, int cube) {
  const int inner = b.add(b.x, b.mul(b.c(0.044715), cube));
  const int t = b.fn("tanh", {b.mul(b.c(std::sqrt(2.0 / M_PI)), inner)});
  return b.mul(b.mul(b.c(0.5), b.x), b.add(b.c(1.0), t));
}

TEST(Fingerprint, GeluTanhWrittenWithPow) {
  ExprBuilder b;
  const int out = gelu_tanh_of(b, b.fn("pow", {b.x, b.c(3.0)}));
  EXPECT_EQ(b.fingerprint(out), "gelu_tanh");
}

TEST(Fingerprint, GeluTanhWrittenWithProducts) {
  ExprBuilder b;
  const int out = gelu_tanh_of(b, b.mul(b.mul(b.x, b.x), b.x));
  EXPECT_EQ(b.fingerprint(out), "gelu_tanh");
}

TEST(Fingerprint, GeluTanhWithAWrongConstantIsNothing) {
  ExprBuilder b;
  const int cube = b.fn("pow", {b.x, b.c(3.0)});
  const int inner = b.add(b.x, b.mul(b.c(0.1), cube));  // 0.1 instead of 0.044715
  const int t = b.fn("tanh", {b.mul(b.c(std::sqrt(2.0 / M_PI)), inner)});
  const int out = b.mul(b.mul(b.c(0.5), b.x), b.add(b.c(1.0), t));
  EXPECT_EQ(b.fingerprint(out), "");
}

TEST(Fingerprint, SiluAsXTimesSigmoid) {
  ExprBuilder b;
  EXPECT_EQ(b.fingerprint(b.mul(b.x, b.fn("sigmoid", {b.x}))), "silu");
}

TEST(Fingerprint, SiluAsXOverOnePlusExpNegX) {
  ExprBuilder b;
  const int out = b.fn("div", {b.x, b.add(b.c(1.0), b.fn("exp", {b.fn("neg", {b.x})}))});
  EXPECT_EQ(b.fingerprint(out), "silu");
}

TEST(Fingerprint, MishAsXTimesTanhSoftplus) {
  ExprBuilder b;
  EXPECT_EQ(b.fingerprint(b.mul(b.x, b.fn("tanh", {b.fn("softplus", {b.x})}))), "mish");
}

TEST(Fingerprint, GeluErf) {
  ExprBuilder b;
  const int erf = b.fn("erf", {b.fn("div", {b.x, b.c(std::sqrt(2.0))})});
  const int out = b.mul(b.mul(b.c(0.5), b.x), b.add(b.c(1.0), erf));
  EXPECT_EQ(b.fingerprint(out), "gelu_erf");
}

TEST(Fingerprint, ReluAsMaximumWithZero) {
  ExprBuilder b;
  EXPECT_EQ(b.fingerprint(b.fn("maximum", {b.x, b.c(0.0)})), "relu");
}

TEST(Fingerprint, AffineIsNotAnActivation) {
  ExprBuilder b;
  EXPECT_EQ(b.fingerprint(b.add(b.mul(b.c(2.0), b.x), b.c(1.0))), "");
}

TEST(Fingerprint, IdentityIsNotAnActivation) {
  ExprBuilder b;
  EXPECT_EQ(b.fingerprint(b.mul(b.x, b.c(1.0))), "");
}

TEST(Fingerprint, ADependenceOnAnotherTensorIsNotAnActivation) {
  ExprBuilder b;
  const int other = b.operand(0);
  EXPECT_EQ(b.fingerprint(b.mul(b.x, b.fn("sigmoid", {other}))), "");
}

TEST(Expr, EvalUnaryAndKnownFunctions) {
  ExprBuilder b;
  const int out = b.add(b.mul(b.c(2.0), b.x), b.c(1.0));
  EXPECT_DOUBLE_EQ(*discover::eval_unary(b.g, b.x, out, 3.0), 7.0);
  EXPECT_TRUE(discover::known_function("gelu_tanh"));
  EXPECT_TRUE(discover::known_function("cast"));
  EXPECT_FALSE(discover::known_function("cumsum"));
  EXPECT_DOUBLE_EQ(discover::eval_function("leaky_relu", {-2.0}, {0.2}), -0.4);
  EXPECT_DOUBLE_EQ(discover::eval_function("hardtanh", {5.0}, {-2.0, 2.0}), 2.0);
  EXPECT_DOUBLE_EQ(discover::eval_function("clamp", {-5.0}, {0.0, INFINITY}), 0.0);
}

TEST(Expr, CompactDropsDeadExpressions) {
  ExprBuilder b;
  b.fn("exp", {b.x});                      // dead
  const int live = b.fn("relu", {b.x});
  b.g.root = live;
  b.g.compact();
  ASSERT_EQ(b.g.exprs.size(), 2u);
  EXPECT_EQ(b.g.exprs[static_cast<size_t>(b.g.root)].fn, "relu");
  EXPECT_EQ(b.g.to_text({}), "relu(acc)");
}

// ---------------------------------------------------------------------------------------------
// Broadcast classes

ir::TensorType tt(std::vector<int64_t> shape) {
  ir::TensorType t;
  t.shape = shape;
  t.strides = contiguous_strides(shape);
  return t;
}

TEST(BroadcastKind, Scalar) {
  EXPECT_EQ(discover::broadcast_kind(tt({}), tt({4, 8})), "scalar");
  EXPECT_EQ(discover::broadcast_kind(tt({1}), tt({4, 8})), "scalar");
  EXPECT_EQ(discover::broadcast_kind(tt({1, 1}), tt({2, 4, 8})), "scalar");
}

TEST(BroadcastKind, Row) {
  EXPECT_EQ(discover::broadcast_kind(tt({8}), tt({4, 8})), "row");
  EXPECT_EQ(discover::broadcast_kind(tt({1, 8}), tt({4, 8})), "row");
  EXPECT_EQ(discover::broadcast_kind(tt({8}), tt({2, 4, 8})), "row");
}

TEST(BroadcastKind, Col) {
  EXPECT_EQ(discover::broadcast_kind(tt({4, 1}), tt({4, 8})), "col");
  EXPECT_EQ(discover::broadcast_kind(tt({2, 4, 1}), tt({2, 4, 8})), "col");
}

TEST(BroadcastKind, Full) {
  EXPECT_EQ(discover::broadcast_kind(tt({4, 8}), tt({4, 8})), "full");
  EXPECT_EQ(discover::broadcast_kind(tt({2, 4, 8}), tt({2, 4, 8})), "full");
}

TEST(BroadcastKind, Unsupported) {
  EXPECT_EQ(discover::broadcast_kind(tt({3}), tt({4, 8})), "");           // wrong length
  EXPECT_EQ(discover::broadcast_kind(tt({4}), tt({4, 8})), "");           // [4] aligns with columns
  EXPECT_EQ(discover::broadcast_kind(tt({4, 8}), tt({2, 4, 8})), "");     // per-matrix, not per-row
  EXPECT_EQ(discover::broadcast_kind(tt({2, 1, 8}), tt({2, 4, 8})), "");  // a row per batch
  EXPECT_EQ(discover::broadcast_kind(tt({3, 4, 8}), tt({4, 8})), "");     // more dims than the output
}

// ---------------------------------------------------------------------------------------------
// grow_epilogue on real graphs: y = linear(x, W[, b]) [M=16, K=32, N=8] followed by a tail

struct Grown {
  ir::Graph g;
  Epilogue ep;
};

// The graph so far; `tail` adds nodes reading "y". The GEMM is node "y".
GraphBuilder linear_graph(const std::string& dt, bool bias) {
  GraphBuilder b(dt);
  b.input("x", T(dt, {16, 32}));
  b.param("w", T(dt, {8, 32}));
  if (bias) b.param("b", T(dt, {8}));
  std::vector<json> args = {N("x"), N("w")};
  if (bias) args.push_back(N("b"));
  b.call("y", "aten.linear.default", args, T(dt, {16, 8}));
  return b;
}

Grown grow(const GraphBuilder& b) {
  Grown r{b.load(), {}};
  discover::GemmShape s;
  std::string why;
  const int gemm = id_of(r.g, "y");
  EXPECT_TRUE(discover::gemm_shape(r.g, gemm, s, why)) << why;
  r.ep = discover::grow_epilogue(r.g, gemm, s.seed, s.seed_operands);
  return r;
}

std::vector<std::string> names(const ir::Graph& g, const std::vector<int>& ids) {
  std::vector<std::string> out;
  for (int id : ids) out.push_back(g.node(id).name);
  return out;
}

const Expr* find_fn(const ExprGraph& e, const std::string& fn) {
  for (const auto& x : e.exprs) {
    if (x.kind == Expr::Kind::fn && x.fn == fn) return &x;
  }
  return nullptr;
}

class GrowEpilogue : public ::testing::TestWithParam<std::string> {
 protected:
  std::string dt() const { return GetParam(); }
  json t() const { return T(dt(), {16, 8}); }
};

TEST_P(GrowEpilogue, NoTailKeepsOnlyTheBias) {
  auto b = linear_graph(dt(), true);
  const auto r = grow(b);
  EXPECT_EQ(r.ep.steps, Steps({"bias"}));
  EXPECT_TRUE(r.ep.nodes.empty());
  EXPECT_EQ(r.ep.output, id_of(r.g, "y"));
  EXPECT_EQ(r.ep.text(), "acc + b");
}

TEST_P(GrowEpilogue, BiasRelu) {
  auto b = linear_graph(dt(), true);
  b.call("r", "aten.relu.default", {N("y")}, t());
  const auto r = grow(b);
  EXPECT_EQ(r.ep.steps, Steps({"bias", "relu"}));
  EXPECT_EQ(names(r.g, r.ep.nodes), Steps({"r"}));
  EXPECT_EQ(r.ep.output, id_of(r.g, "r"));
  ASSERT_EQ(r.ep.operands.size(), 1u);
  EXPECT_EQ(r.ep.operands[0].node, id_of(r.g, "b"));
  EXPECT_EQ(r.ep.operands[0].broadcast, "row");
  EXPECT_EQ(r.ep.text(), "relu(acc + b)");
}

TEST_P(GrowEpilogue, ScaleThenLeakyReluCarriesItsSlope) {
  auto b = linear_graph(dt(), false);
  b.call("s", "aten.mul.Tensor", {N("y"), 0.5}, t());
  b.call("lr", "aten.leaky_relu.default", {N("s"), 0.2}, t());
  const auto r = grow(b);
  EXPECT_EQ(r.ep.steps, Steps({"scale", "leaky_relu"}));
  EXPECT_EQ(r.ep.nodes.size(), 2u);
  const Expr* lr = find_fn(r.ep.expr, "leaky_relu");
  ASSERT_NE(lr, nullptr);
  EXPECT_EQ(lr->params, std::vector<double>({0.2}));
  EXPECT_TRUE(r.ep.operands.empty());
  EXPECT_EQ(r.ep.text(), "leaky_relu(acc * 0.5, 0.2)");
}

TEST_P(GrowEpilogue, RsubScalesSelfByAlpha) {
  // torch.rsub(y, 1.0, alpha=2) = 1 - 2*y: alpha scales self, not other.
  auto b = linear_graph(dt(), false);
  b.call("r", "aten.rsub.Scalar", {N("y"), 1.0}, t(), {{"alpha", 2.0}});
  const auto r = grow(b);
  ASSERT_EQ(r.ep.nodes.size(), 1u);
  EXPECT_EQ(r.ep.text(), "1 - (acc * 2)");
}

TEST_P(GrowEpilogue, ClampWithTensorBoundsKeepsTheBounds) {
  // clamp(y, min=lo) with lo a [8] buffer: maximum with an operand, never a dropped bound.
  auto b = linear_graph(dt(), false);
  b.param("lo", T(dt(), {8}));
  b.call("c", "aten.clamp.Tensor", {N("y"), N("lo")}, t());
  const auto r = grow(b);
  ASSERT_EQ(r.ep.nodes.size(), 1u);
  ASSERT_EQ(r.ep.operands.size(), 1u);
  EXPECT_EQ(r.ep.operands[0].broadcast, "row");
  EXPECT_EQ(r.ep.text(), "maximum(acc, lo)");
}

TEST_P(GrowEpilogue, StridedOperandIsNotAbsorbed) {
  // y + z.t() with z [8, 16]: a full-shape operand that is not row-major is not read densely.
  auto b = linear_graph(dt(), false);
  b.input("z", T(dt(), {8, 16}));
  b.call("zt", "aten.t.default", {N("z")}, T(dt(), {16, 8}, std::vector<int64_t>{1, 16}));
  b.call("s", "aten.add.Tensor", {N("y"), N("zt")}, t());
  const auto r = grow(b);
  EXPECT_TRUE(r.ep.nodes.empty());
  ASSERT_FALSE(r.ep.stops.empty());
  EXPECT_NE(r.ep.stops[0].find("strided view"), std::string::npos) << r.ep.stops[0];
}

TEST_P(GrowEpilogue, SubtractRowThenMultiplyByColumnThenRelu) {
  auto b = linear_graph(dt(), false);
  b.param("v", T(dt(), {8}));
  b.input("c", T(dt(), {16, 1}));
  b.call("d", "aten.sub.Tensor", {N("y"), N("v")}, t());
  b.call("m", "aten.mul.Tensor", {N("d"), N("c")}, t());
  b.call("r", "aten.relu.default", {N("m")}, t());
  const auto r = grow(b);
  EXPECT_EQ(r.ep.steps, Steps({"sub", "mul", "relu"}));
  EXPECT_EQ(names(r.g, r.ep.nodes), Steps({"d", "m", "r"}));
  ASSERT_EQ(r.ep.operands.size(), 2u);
  EXPECT_EQ(r.ep.operands[0].role, "v");
  EXPECT_EQ(r.ep.operands[0].broadcast, "row");
  EXPECT_EQ(r.ep.operands[1].role, "c");
  EXPECT_EQ(r.ep.operands[1].broadcast, "col");
}

TEST_P(GrowEpilogue, SubtractRowThenScaleThenRelu) {
  auto b = linear_graph(dt(), true);
  b.buffer("vec", T(dt(), {8}));
  b.call("d", "aten.sub.Tensor", {N("y"), N("vec")}, t());
  b.call("m", "aten.mul.Tensor", {N("d"), 3.0}, t());
  b.call("r", "aten.relu.default", {N("m")}, t());
  const auto r = grow(b);
  EXPECT_EQ(r.ep.steps, Steps({"bias", "sub", "scale", "relu"}));
  EXPECT_EQ(r.ep.nodes.size(), 3u);
}

TEST_P(GrowEpilogue, SigmoidThenResidual) {
  auto b = linear_graph(dt(), true);
  b.input("res", t());
  b.call("sg", "aten.sigmoid.default", {N("y")}, t());
  b.call("out", "aten.add.Tensor", {N("sg"), N("res")}, t());
  const auto r = grow(b);
  EXPECT_EQ(r.ep.steps, Steps({"bias", "sigmoid", "residual"}));
  EXPECT_EQ(r.ep.nodes.size(), 2u);
  EXPECT_EQ(r.ep.output, id_of(r.g, "out"));
  ASSERT_EQ(r.ep.operands.size(), 2u);
  EXPECT_EQ(r.ep.operands[1].broadcast, "full");
}

TEST_P(GrowEpilogue, HardtanhThenGelu) {
  auto b = linear_graph(dt(), true);
  b.call("ht", "aten.hardtanh.default", {N("y"), -2.0, 2.0}, t());
  b.call("ge", "aten.gelu.default", {N("ht")}, t());
  const auto r = grow(b);
  EXPECT_EQ(r.ep.steps, Steps({"bias", "hardtanh", "gelu_erf"}));
  EXPECT_EQ(r.ep.nodes.size(), 2u);
  const Expr* ht = find_fn(r.ep.expr, "hardtanh");
  ASSERT_NE(ht, nullptr);
  EXPECT_EQ(ht->params, std::vector<double>({-2.0, 2.0}));
}

TEST_P(GrowEpilogue, GeluTanhOp) {
  auto b = linear_graph(dt(), true);
  b.call("ge", "aten.gelu.default", {N("y")}, t(), {{"approximate", "tanh"}});
  const auto r = grow(b);
  EXPECT_EQ(r.ep.steps, Steps({"bias", "gelu_tanh"}));
}

TEST_P(GrowEpilogue, MishOp) {
  auto b = linear_graph(dt(), true);
  b.call("mi", "aten.mish.default", {N("y")}, t());
  const auto r = grow(b);
  EXPECT_EQ(r.ep.steps, Steps({"bias", "mish"}));
  EXPECT_EQ(r.ep.nodes.size(), 1u);
}

TEST_P(GrowEpilogue, ClampMinCarriesItsBound) {
  auto b = linear_graph(dt(), true);
  b.call("cm", "aten.clamp_min.default", {N("y"), 0.25}, t());
  const auto r = grow(b);
  EXPECT_EQ(r.ep.steps, Steps({"bias", "clamp_min"}));
  EXPECT_EQ(r.ep.nodes.size(), 1u);
  const Expr* cl = find_fn(r.ep.expr, "clamp");
  ASSERT_NE(cl, nullptr);
  ASSERT_EQ(cl->params.size(), 2u);
  EXPECT_DOUBLE_EQ(cl->params[0], 0.25);
  EXPECT_TRUE(std::isinf(cl->params[1]) && cl->params[1] > 0);
}

// The tanh GELU as written in GPT-2: eight pointwise nodes folded into one step.
void add_hand_gelu_tanh(GraphBuilder& b, const json& t, bool with_pow) {
  if (with_pow) {
    b.call("cube", "aten.pow.Tensor_Scalar", {N("y"), 3.0}, t);
  } else {
    b.call("sq", "aten.mul.Tensor", {N("y"), N("y")}, t);
    b.call("cube", "aten.mul.Tensor", {N("sq"), N("y")}, t);
  }
  b.call("m1", "aten.mul.Tensor", {N("cube"), 0.044715}, t);
  b.call("a1", "aten.add.Tensor", {N("y"), N("m1")}, t);
  b.call("m2", "aten.mul.Tensor", {N("a1"), 0.7978845608028654}, t);
  b.call("th", "aten.tanh.default", {N("m2")}, t);
  b.call("a2", "aten.add.Tensor", {N("th"), 1.0}, t);
  b.call("half", "aten.mul.Tensor", {N("y"), 0.5}, t);
  b.call("out", "aten.mul.Tensor", {N("half"), N("a2")}, t);
}

TEST_P(GrowEpilogue, HandWrittenGeluTanhFoldsToOneStep) {
  auto b = linear_graph(dt(), true);
  add_hand_gelu_tanh(b, t(), true);
  const auto r = grow(b);
  EXPECT_EQ(r.ep.steps, Steps({"bias", "gelu_tanh"}));
  EXPECT_EQ(r.ep.nodes.size(), 8u);
  EXPECT_EQ(r.ep.output, id_of(r.g, "out"));
  EXPECT_EQ(r.ep.text(), "gelu_tanh(acc + b)");
  const Expr* folded = find_fn(r.ep.expr, "gelu_tanh");
  ASSERT_NE(folded, nullptr);
  EXPECT_TRUE(folded->folded);
  EXPECT_EQ(folded->nodes.size(), 8u);  // it stands for every node it replaced
}

TEST_P(GrowEpilogue, HandWrittenGeluTanhWithProductsFoldsToOneStep) {
  auto b = linear_graph(dt(), false);
  add_hand_gelu_tanh(b, t(), false);
  const auto r = grow(b);
  EXPECT_EQ(r.ep.steps, Steps({"gelu_tanh"}));
  EXPECT_EQ(r.ep.nodes.size(), 9u);
  EXPECT_EQ(r.ep.text(), "gelu_tanh(acc)");
}

TEST_P(GrowEpilogue, HandWrittenSiluFolds) {
  auto b = linear_graph(dt(), true);
  b.call("sg", "aten.sigmoid.default", {N("y")}, t());
  b.call("out", "aten.mul.Tensor", {N("y"), N("sg")}, t());
  const auto r = grow(b);
  EXPECT_EQ(r.ep.steps, Steps({"bias", "silu"}));
  EXPECT_EQ(r.ep.nodes.size(), 2u);
}

TEST_P(GrowEpilogue, CastsAreAbsorbedWithoutASteps) {
  auto b = linear_graph(dt(), true);
  b.call("up", "aten._to_copy.default", {N("y")}, T("f32", {16, 8}), {{"dtype", DTypeArg("f32")}});
  b.call("r", "aten.relu.default", {N("up")}, T("f32", {16, 8}));
  const auto r = grow(b);
  EXPECT_EQ(r.ep.steps, Steps({"bias", "relu"}));
  EXPECT_EQ(names(r.g, r.ep.nodes), Steps({"up", "r"}));
}

// einsum's decomposition ends its contraction with (16, 1, 8) -> permute -> (16, 8, 1) -> view
// (16, 8): views that keep the elements' order, one of them not ending in the GEMM's columns.
GraphBuilder einsum_tail(const std::string& dt) {
  auto b = linear_graph(dt, true);
  b.call("v1", "aten.view.default", {N("y"), L({16, 1, 8})}, T(dt, {16, 1, 8}));
  b.call("p", "aten.permute.default", {N("v1"), L({0, 2, 1})}, T(dt, {16, 8, 1}, std::vector<int64_t>{8, 1, 8}));
  b.call("v2", "aten.view.default", {N("p"), L({16, 8})}, T(dt, {16, 8}));
  return b;
}

TEST_P(GrowEpilogue, PermuteOfUnitDimsIsAPassThroughView) {
  auto b = einsum_tail(dt());
  b.call("r", "aten.relu.default", {N("v2")}, t());
  const auto r = grow(b);
  EXPECT_EQ(r.ep.steps, Steps({"bias", "relu"}));
  EXPECT_EQ(names(r.g, r.ep.nodes), Steps({"v1", "p", "v2", "r"}));
  EXPECT_EQ(r.ep.output, id_of(r.g, "r"));
}

TEST_P(GrowEpilogue, AViewNotEndingInTheColumnsIsNeitherComputedOnNorTheResult) {
  auto b = einsum_tail(dt());
  b.call("r", "aten.relu.default", {N("p")}, T(dt(), {16, 8, 1}, std::vector<int64_t>{8, 1, 8}));
  const auto r = grow(b);
  EXPECT_EQ(r.ep.output, id_of(r.g, "v1"));  // the last view ending in the columns
  EXPECT_EQ(names(r.g, r.ep.nodes), Steps({"v1"}));
  bool said = false;
  for (const auto& stop : r.ep.stops) said = said || stop.find("stops before 'r'") != std::string::npos;
  EXPECT_TRUE(said) << ::testing::PrintToString(r.ep.stops);
}

TEST_P(GrowEpilogue, APermuteThatMovesDataIsNotAView) {
  GraphBuilder b(dt());
  b.input("x", T(dt(), {16, 32}));
  b.param("w", T(dt(), {8, 32}));
  b.call("y", "aten.linear.default", {N("x"), N("w")}, T(dt(), {16, 8}));
  b.call("p", "aten.permute.default", {N("y"), L({1, 0})}, T(dt(), {8, 16}, std::vector<int64_t>{1, 8}));
  b.call("r", "aten.relu.default", {N("p")}, T(dt(), {8, 16}, std::vector<int64_t>{1, 8}));
  const auto r = grow(b);
  EXPECT_TRUE(r.ep.nodes.empty()) << ::testing::PrintToString(names(r.g, r.ep.nodes));
}

TEST_P(GrowEpilogue, StopsAtANonPointwiseNode) {
  auto b = linear_graph(dt(), true);
  b.call("r", "aten.relu.default", {N("y")}, t());
  b.call("s", "aten.sum.dim_IntList", {N("r"), L({-1})}, T(dt(), {16}));
  const auto r = grow(b);
  EXPECT_EQ(r.ep.steps, Steps({"bias", "relu"}));
  EXPECT_EQ(names(r.g, r.ep.nodes), Steps({"r"}));
  ASSERT_EQ(r.ep.stops.size(), 1u);
  EXPECT_NE(r.ep.stops[0].find("stops before 's'"), std::string::npos) << r.ep.stops[0];
  EXPECT_NE(r.ep.stops[0].find("not a pointwise op"), std::string::npos) << r.ep.stops[0];
}

TEST_P(GrowEpilogue, SecondNonPointwiseUserOfTheGemmMeansNoEpilogue) {
  auto b = linear_graph(dt(), false);
  b.call("r", "aten.relu.default", {N("y")}, t());
  b.call("s", "aten.sum.dim_IntList", {N("y"), L({-1})}, T(dt(), {16}));
  b.outputs({"r", "s"});
  const auto r = grow(b);
  EXPECT_TRUE(r.ep.steps.empty());
  EXPECT_TRUE(r.ep.nodes.empty());
  EXPECT_EQ(r.ep.output, id_of(r.g, "y"));
  bool no_epilogue = false, names_sum = false;
  for (const auto& s : r.ep.stops) {
    no_epilogue = no_epilogue || s.find("no epilogue") != std::string::npos;
    names_sum = names_sum || s.find("'s'") != std::string::npos;
  }
  EXPECT_TRUE(no_epilogue) << ::testing::PrintToString(r.ep.stops);
  EXPECT_TRUE(names_sum) << ::testing::PrintToString(r.ep.stops);
}

TEST_P(GrowEpilogue, GemmThatIsAlsoAGraphOutputKeepsItsTailOut) {
  auto b = linear_graph(dt(), false);
  b.call("r", "aten.relu.default", {N("y")}, t());
  b.outputs({"y", "r"});
  const auto r = grow(b);
  EXPECT_TRUE(r.ep.nodes.empty());
  EXPECT_EQ(r.ep.output, id_of(r.g, "y"));
}

TEST_P(GrowEpilogue, OperandDependingOnTheGemmIsNotAbsorbed) {
  auto b = linear_graph(dt(), false);
  b.call("r", "aten.relu.default", {N("y")}, t());
  b.call("rowsum", "aten.sum.dim_IntList", {N("y"), L({-1}), true}, T(dt(), {16, 1}));
  b.call("out", "aten.div.Tensor", {N("r"), N("rowsum")}, t());
  const auto r = grow(b);
  EXPECT_TRUE(r.ep.nodes.empty());  // y is also read by the sum: no single-exit tail
  bool other_path = false;
  for (const auto& s : r.ep.stops) {
    other_path = other_path || (s.find("stops before 'out'") != std::string::npos &&
                                s.find("depends on the GEMM by another path") != std::string::npos);
  }
  EXPECT_TRUE(other_path) << ::testing::PrintToString(r.ep.stops);
}

TEST_P(GrowEpilogue, OperandOfUnsupportedBroadcastStopsTheTail) {
  auto b = linear_graph(dt(), true);
  b.input("odd", T(dt(), {2, 1, 8}));  // one row per batch: neither row, col nor full
  b.call("r", "aten.relu.default", {N("y")}, t());
  // A shape-only view keeps the GEMM's elements, so the tail may go on through it.
  b.call("v", "aten.view.default", {N("r"), L({2, 8, 8})}, T(dt(), {2, 8, 8}));
  b.call("m", "aten.mul.Tensor", {N("v"), N("odd")}, T(dt(), {2, 8, 8}));
  const auto r = grow(b);
  EXPECT_EQ(names(r.g, r.ep.nodes), Steps({"r", "v"}));
  ASSERT_EQ(r.ep.stops.size(), 1u);
  EXPECT_NE(r.ep.stops[0].find("'odd'"), std::string::npos) << r.ep.stops[0];
}

TEST_P(GrowEpilogue, DiamondInsideTheTailIsOneRegion) {
  // relu(y) * sigmoid(y): both branches read the GEMM, and meet again.
  auto b = linear_graph(dt(), false);
  b.call("r", "aten.relu.default", {N("y")}, t());
  b.call("sg", "aten.sigmoid.default", {N("y")}, t());
  b.call("out", "aten.mul.Tensor", {N("r"), N("sg")}, t());
  const auto r = grow(b);
  EXPECT_EQ(names(r.g, r.ep.nodes), Steps({"r", "sg", "out"}));
  EXPECT_EQ(r.ep.steps, Steps({"relu", "sigmoid", "mul"}));
}

// Side computations: a full-shaped operand made of vectors alone is computed in the epilogue.

TEST_P(GrowEpilogue, OuterProductOfVectorsIsComputedInTheEpilogue) {
  // A LayerNorm folded into the GEMM: acc * rstd - (mean * rstd) * c1 + c2, with mean and rstd
  // per row ([16, 1]) and c1, c2 per column ([8]). mr * c1 is an outer product: PyTorch would
  // write it as a [16, 8] tensor for the kernel to read back.
  auto b = linear_graph(dt(), false);
  b.input("mean", T(dt(), {16, 1}));
  b.input("rstd", T(dt(), {16, 1}));
  b.param("c1", T(dt(), {8}));
  b.param("c2", T(dt(), {8}));
  b.call("mr", "aten.mul.Tensor", {N("mean"), N("rstd")}, T(dt(), {16, 1}));
  b.call("outer", "aten.mul.Tensor", {N("mr"), N("c1")}, t());
  b.call("s", "aten.mul.Tensor", {N("y"), N("rstd")}, t());
  b.call("d", "aten.sub.Tensor", {N("s"), N("outer")}, t());
  b.call("o", "aten.add.Tensor", {N("d"), N("c2")}, t());
  const auto r = grow(b);
  // mr is a column vector already: PyTorch computes it (16 values), the kernel reads it.
  EXPECT_EQ(names(r.g, r.ep.nodes), Steps({"outer", "s", "d", "o"}));
  EXPECT_EQ(r.ep.output, id_of(r.g, "o"));
  std::vector<std::pair<std::string, std::string>> leaves;
  for (const auto& o : r.ep.operands) leaves.emplace_back(o.role, o.broadcast);
  EXPECT_EQ(leaves, (std::vector<std::pair<std::string, std::string>>{
                        {"mr", "col"}, {"c1", "row"}, {"rstd", "col"}, {"c2", "row"}}));
  EXPECT_EQ(r.ep.text(), "((acc * rstd) - (mr * c1)) + c2");
}

TEST_P(GrowEpilogue, ScaleMadeOfRowAndColumnScalesIsComputedInTheEpilogue) {
  // Dequantisation written as acc * (sa[:, None] * sb[None, :]).
  auto b = linear_graph(dt(), false);
  b.input("sa", T(dt(), {16, 1}));
  b.param("sb", T(dt(), {1, 8}));
  b.call("scale", "aten.mul.Tensor", {N("sa"), N("sb")}, t());
  b.call("o", "aten.mul.Tensor", {N("y"), N("scale")}, t());
  const auto r = grow(b);
  EXPECT_EQ(names(r.g, r.ep.nodes), Steps({"scale", "o"}));
  ASSERT_EQ(r.ep.operands.size(), 2u);
  EXPECT_EQ(r.ep.operands[0].broadcast, "col");
  EXPECT_EQ(r.ep.operands[1].broadcast, "row");
  EXPECT_EQ(r.ep.text(), "acc * (sa * sb)");
}

TEST_P(GrowEpilogue, OuterProductReadElsewhereStaysAFullOperand) {
  // The product is also a graph output: PyTorch computes it anyway, the kernel reads it.
  auto b = linear_graph(dt(), false);
  b.input("sa", T(dt(), {16, 1}));
  b.param("sb", T(dt(), {8}));
  b.call("scale", "aten.mul.Tensor", {N("sa"), N("sb")}, t());
  b.call("o", "aten.mul.Tensor", {N("y"), N("scale")}, t());
  b.outputs({"o", "scale"});
  const auto r = grow(b);
  EXPECT_EQ(names(r.g, r.ep.nodes), Steps({"o"}));
  ASSERT_EQ(r.ep.operands.size(), 1u);
  EXPECT_EQ(r.ep.operands[0].role, "scale");
  EXPECT_EQ(r.ep.operands[0].broadcast, "full");
}

TEST_P(GrowEpilogue, FullOperandMadeFromAFullTensorIsNotRecomputed) {
  // z * 2 with z [16, 8]: computing it in the epilogue would read z, no fewer bytes.
  auto b = linear_graph(dt(), false);
  b.input("z", t());
  b.call("z2", "aten.mul.Tensor", {N("z"), 2.0}, t());
  b.call("o", "aten.add.Tensor", {N("y"), N("z2")}, t());
  const auto r = grow(b);
  EXPECT_EQ(names(r.g, r.ep.nodes), Steps({"o"}));
  ASSERT_EQ(r.ep.operands.size(), 1u);
  EXPECT_EQ(r.ep.operands[0].role, "z2");
  EXPECT_EQ(r.ep.operands[0].broadcast, "full");
}

// Regression test for a bug these tests found (since fixed): grow_epilogue
// (engine/discover/epilogue.cpp, step 1) checked how each extra operand broadcasts into a node's
// output, but not that the node's output has the GEMM's shape. A node that broadcasts the GEMM
// result *up* (more elements than the GEMM writes) was absorbed, and the plan then claimed a [16, 8] GEMM epilogue produces a [2, 16, 8] tensor.
TEST(GrowEpilogueBugs, AddThatBroadcastsTheGemmOutputUpIsNotAbsorbed) {
  auto b = linear_graph("f32", false);
  b.input("z", T("f32", {2, 16, 8}));
  b.call("o", "aten.add.Tensor", {N("y"), N("z")}, T("f32", {2, 16, 8}));
  const auto r = grow(b);
  EXPECT_TRUE(r.ep.nodes.empty()) << "absorbed: " << ::testing::PrintToString(names(r.g, r.ep.nodes));
  EXPECT_EQ(r.ep.output, id_of(r.g, "y"));
}

TEST(GrowEpilogueBugs, SingleColumnGemmBroadcastAcrossColumnsIsNotAbsorbed) {
  GraphBuilder b;
  b.input("x", T("f32", {16, 32}));
  b.param("w", T("f32", {1, 32}));
  b.input("z", T("f32", {16, 8}));
  b.call("y", "aten.linear.default", {N("x"), N("w")}, T("f32", {16, 1}));
  b.call("o", "aten.add.Tensor", {N("y"), N("z")}, T("f32", {16, 8}));
  const auto r = grow(b);
  EXPECT_TRUE(r.ep.nodes.empty()) << "absorbed: " << ::testing::PrintToString(names(r.g, r.ep.nodes));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GrowEpilogue, ::testing::Values("f32", "bf16"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace fact::test
