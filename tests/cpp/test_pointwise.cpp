// Pointwise regions: what the planner groups after the other rules (families/pointwise/rule_pointwise.cpp)
// and the kernels emitted for them (families/pointwise/pointwise.h), with golden files.
//
// Update the golden files after an intended change with FACT_UPDATE_GOLDEN=1 ctest -R Pointwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "golden.h"
#include "families/pointwise/pointwise.h"
#include "sample_graphs.h"

namespace fact::test {
namespace {

using discover::Family;
using nlohmann::json;
using realize::NotSupported;
using realize::PointwiseSpec;
using Names = std::vector<std::string>;

// Llama's rotary embedding on a projected, head-split query (batch 2, 4 heads, seq 16, dim 64):
// q * cos + cat(-q[..., 32:], q[..., :32]) * sin, q a transposed view of the projection.
GraphBuilder rope_graph(const std::string& dt = "bf16") {
  GraphBuilder b(dt);
  b.input("x", T(dt, {2, 16, 256}));
  b.param("w", T(dt, {256, 256}));
  b.buffer("cos", T(dt, {16, 64}));
  b.buffer("sin", T(dt, {16, 64}));
  b.call("linear", "aten.linear.default", {N("x"), N("w")}, T(dt, {2, 16, 256}));
  b.call("view", "aten.view.default", {N("linear"), L({2, 16, 4, 64})}, T(dt, {2, 16, 4, 64}));
  const auto strided = T(dt, {2, 4, 16, 64}, std::vector<int64_t>{4096, 64, 256, 1});
  b.call("transpose", "aten.transpose.int", {N("view"), 1, 2}, strided);
  b.call("mul", "aten.mul.Tensor", {N("transpose"), N("cos")}, strided);
  const auto half = T(dt, {2, 4, 16, 32}, std::vector<int64_t>{4096, 64, 256, 1});
  b.call("slice_a", "aten.slice.Tensor", {N("transpose"), 3, 0, 32}, half);
  b.call("slice_b", "aten.slice.Tensor", {N("transpose"), 3, 32, 9223372036854775807LL}, half);
  b.call("neg", "aten.neg.default", {N("slice_b")}, T(dt, {2, 4, 16, 32}));
  b.call("cat", "aten.cat.default", {json::array({N("neg"), N("slice_a")}), -1}, T(dt, {2, 4, 16, 64}));
  b.call("mul_1", "aten.mul.Tensor", {N("cat"), N("sin")}, T(dt, {2, 4, 16, 64}));
  b.call("add", "aten.add.Tensor", {N("mul"), N("mul_1")}, strided);
  return b;
}

// The chosen pointwise region (the one ending at `output`, if given); nullptr if none.
const discover::Candidate* pointwise(const Planned& p, const std::string& output = "") {
  for (const auto& c : p.d.chosen) {
    if (c.match.family == Family::pointwise && (output.empty() || p.g.node(c.match.output).name == output)) {
      return &c;
    }
  }
  return nullptr;
}

json plan_pattern(const Planned& p, const discover::Candidate& c) {
  json ops = json::array();
  for (const auto& o : c.match.operands) {
    ops.push_back({{"role", o.role}, {"node", p.g.node(o.node).name}, {"type", p.g.node(o.node).type().str()}});
  }
  return {{"family", "pointwise"},
          {"epilogue_expr", c.match.epilogue_expr},
          {"operands", ops},
          {"attrs", c.match.attrs},
          {"problem", c.match.problem}};
}

// ---------------------------------------------------------------------------------------------
// Discovery

TEST(PointwiseRegion, RopeIsOneRegionReadingTheProjectionInPlace) {
  const auto p = plan(rope_graph());
  const auto* c = pointwise(p);
  ASSERT_NE(c, nullptr);
  const auto& m = c->match;
  EXPECT_EQ(m.rule, "pointwise_region");
  EXPECT_EQ(names(p.g, m.nodes), (Names{"mul", "slice_a", "slice_b", "neg", "cat", "mul_1", "add"}));
  EXPECT_EQ(p.g.node(m.output).name, "add");
  Names operands;
  for (const auto& o : m.operands) operands.push_back(p.g.node(o.node).name + ":" + o.role);
  EXPECT_EQ(operands, (Names{"transpose:in0", "cos:in1", "sin:in2"}));  // the view, read in place
  EXPECT_EQ(m.epilogue_expr["text"],
            "(transpose * cos) + (cat_last(neg(slice_last(transpose, 32, 32)), slice_last(transpose, 0, 32), 32, 32) "
            "* sin)");
  EXPECT_EQ(m.attrs["strides"], json({4096, 64, 256, 1}));  // the layout eager produced
  EXPECT_EQ(m.problem["cols"], 64);
  EXPECT_GT(c->saving_s(), 0);
  EXPECT_EQ(p.d.rule_hits.at("pointwise_region"), 1);
  // Nothing but the projection is left uncovered... and the projection is a GEMM pattern.
  for (int id : p.d.uncovered) ADD_FAILURE() << "uncovered " << p.g.node(id).name;
}

TEST(PointwiseRegion, AnIntermediateUsedOutsideEndsTheRegion) {
  GraphBuilder b;
  b.input("x", T("f32", {8, 32}));
  b.input("y", T("f32", {8, 32}));
  b.call("a", "aten.mul.Tensor", {N("x"), N("y")}, T("f32", {8, 32}));
  b.call("e", "aten.exp.default", {N("a")}, T("f32", {8, 32}));
  b.call("s", "aten.sigmoid.default", {N("e")}, T("f32", {8, 32}));
  b.call("r", "aten.add.Tensor", {N("s"), N("x")}, T("f32", {8, 32}));
  b.outputs({"r", "e"});  // e is needed outside: the region is s, r (reading e)
  const auto p = plan(b);
  const auto* c = pointwise(p, "r");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(names(p.g, c->match.nodes), (Names{"s", "r"}));
  EXPECT_EQ(p.g.node(c->match.operands[0].node).name, "e");
  // The other region: a then e (e is a graph output, so it can only be an exit).
  const auto* other = pointwise(p, "e");
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(names(p.g, other->match.nodes), (Names{"a", "e"}));
}

TEST(PointwiseRegion, AccessKindsFollowTheTracedLastDim) {
  GraphBuilder b;
  b.input("x", T("f32", {8, 32}));
  b.input("col", T("f32", {8, 1}));
  b.input("xt", T("f32", {32, 8}));
  b.call("t", "aten.t.default", {N("xt")}, T("f32", {8, 32}, std::vector<int64_t>{1, 8}));
  b.call("a", "aten.mul.Tensor", {N("x"), N("col")}, T("f32", {8, 32}));
  b.call("r", "aten.add.Tensor", {N("a"), N("t")}, T("f32", {8, 32}));
  const auto p = plan(b);
  const auto* c = pointwise(p);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->match.attrs["access"], json({"contiguous", "broadcast", "strided"}));
}

TEST(PointwiseRegion, AOneColumnSliceIsABroadcastOperandNotAnIndexShift) {
  // (x - x[..., :1]) * y: every column reads column 0 of x; an index shift would read column c.
  GraphBuilder b;
  b.input("x", T("f32", {4, 64}));
  b.input("y", T("f32", {4, 64}));
  b.call("first", "aten.slice.Tensor", {N("x"), -1, 0, 1}, T("f32", {4, 1}, std::vector<int64_t>{64, 1}));
  b.call("d", "aten.sub.Tensor", {N("x"), N("first")}, T("f32", {4, 64}));
  b.call("r", "aten.mul.Tensor", {N("d"), N("y")}, T("f32", {4, 64}));
  const auto p = plan(b);
  const auto* c = pointwise(p);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(names(p.g, c->match.nodes), (Names{"d", "r"}));
  Names operands;
  for (const auto& o : c->match.operands) operands.push_back(p.g.node(o.node).name);
  EXPECT_EQ(operands, (Names{"x", "first", "y"}));
  EXPECT_EQ(c->match.attrs["access"], json({"contiguous", "broadcast", "contiguous"}));
}

TEST(PointwiseRegion, SlicesWithSymbolicBoundsStayOutside) {
  GraphBuilder b;
  b.input("x", T("f32", {4, 64}));
  b.call("s", "aten.slice.Tensor", {N("x"), -1, json{{"symbol", "s0"}}, 64}, T("f32", {4, 32}));
  b.call("e", "aten.exp.default", {N("s")}, T("f32", {4, 32}));
  b.call("t", "aten.tanh.default", {N("e")}, T("f32", {4, 32}));
  const auto p = plan(b);
  const auto* c = pointwise(p);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(names(p.g, c->match.nodes), (Names{"e", "t"}));
  EXPECT_EQ(p.g.node(c->match.operands[0].node).name, "s");
}

TEST(PointwiseRegion, AnOperandOfAnotherDtypeEndsTheRegionNotDropsIt) {
  // x * idx.float() then tanh: the cast reads int64, which no kernel loads; it stays PyTorch's
  // and the region (the product and tanh) reads its result.
  GraphBuilder b;
  b.input("x", T("f32", {8, 32}));
  b.input("idx", T("i64", {8, 32}));
  b.call("f", "aten.to.dtype", {N("idx"), DTypeArg("f32")}, T("f32", {8, 32}));
  b.call("m", "aten.mul.Tensor", {N("x"), N("f")}, T("f32", {8, 32}));
  b.call("t", "aten.tanh.default", {N("m")}, T("f32", {8, 32}));
  const auto p = plan(b);
  const auto* c = pointwise(p);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(names(p.g, c->match.nodes), (Names{"m", "t"}));
  EXPECT_EQ(names(p.g, p.d.uncovered), (Names{"f"}));
}

TEST(PointwiseRegion, OneOpAloneIsLeftToPytorch) {
  GraphBuilder b;
  b.input("x", T("bf16", {8, 32}));
  b.call("s", "aten.sigmoid.default", {N("x")}, T("bf16", {8, 32}));
  const auto p = plan(b);
  EXPECT_EQ(pointwise(p), nullptr);
  EXPECT_EQ(names(p.g, p.d.uncovered), (Names{"s"}));
}

TEST(PointwiseRegion, GemmEpiloguesComeFirst) {
  GraphBuilder b("bf16");
  b.input("x", T("bf16", {64, 128}));
  b.param("w", T("bf16", {256, 128}));
  b.call("linear", "aten.linear.default", {N("x"), N("w")}, T("bf16", {64, 256}));
  b.call("g", "aten.gelu.default", {N("linear")}, T("bf16", {64, 256}));
  b.call("m", "aten.mul.Tensor", {N("g"), 2.0}, T("bf16", {64, 256}));
  const auto p = plan(b);
  ASSERT_EQ(p.d.chosen.size(), 1u);
  EXPECT_EQ(p.d.chosen[0].match.family, Family::gemm);
  EXPECT_EQ(pointwise(p), nullptr);
}

TEST(PointwiseRegion, ConcatenationsOfOtherDimsStayOutside) {
  GraphBuilder b;
  b.input("x", T("f32", {8, 32}));
  b.input("y", T("f32", {8, 32}));
  b.call("a", "aten.exp.default", {N("x")}, T("f32", {8, 32}));
  b.call("c", "aten.cat.default", {json::array({N("a"), N("y")}), 0}, T("f32", {16, 32}));
  b.call("s", "aten.sigmoid.default", {N("c")}, T("f32", {16, 32}));
  b.call("t", "aten.tanh.default", {N("s")}, T("f32", {16, 32}));
  const auto p = plan(b);
  const auto* c = pointwise(p);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(names(p.g, c->match.nodes), (Names{"s", "t"}));
  EXPECT_EQ(p.g.node(c->match.operands[0].node).name, "c");
}

// ---------------------------------------------------------------------------------------------
// Emission

TEST(PointwiseEmit, RopeKernelShiftsLoadsInsteadOfSlicing) {
  const auto p = plan(rope_graph());
  const auto spec = PointwiseSpec::from_pattern(plan_pattern(p, *pointwise(p)));
  EXPECT_EQ(spec.inputs, (std::vector<std::string>{"bf16", "bf16", "bf16"}));
  EXPECT_EQ(spec.vec, 8);  // 16 bytes of bf16; divides 64 and the boundary at 32
  EXPECT_EQ(spec.rank, 4);
  const auto configs = realize::pointwise_configs(spec);
  ASSERT_EQ(configs.size(), 3u);
  const auto k = realize::emit_pointwise(spec, configs[1]);
  EXPECT_EQ(k.name, "fact_pointwise_bf16_" + spec.id() + "_t256i2");
  // The concatenation is a branch on the column; its halves read q 32 columns away.
  EXPECT_NE(k.source.find("if (c < 32) {"), std::string::npos);
  EXPECT_NE(k.source.find("load_contiguous(in0, base[0] + c + 32, "), std::string::npos);
  EXPECT_NE(k.source.find("load_contiguous(in0, base[0] + c - 32, "), std::string::npos);
  // Every input's last dim was traced contiguous: vector loads without run-time branches.
  EXPECT_EQ(spec.access, (std::vector<std::string>{"contiguous", "contiguous", "contiguous"}));
  EXPECT_NE(k.source.find("constexpr int kAccess[] = {1, 1, 1};"), std::string::npos);
  expect_golden(k, "pointwise_rope_bf16_t256i2.cu");
}

TEST(PointwiseEmit, VectorWidthDividesEveryBoundary) {
  const auto p = plan(rope_graph("f32"));
  json pattern = plan_pattern(p, *pointwise(p));
  EXPECT_EQ(PointwiseSpec::from_pattern(pattern).vec, 4);  // 16 bytes of f32
  // A concatenation at column 6 of 12: two-element vectors.
  for (auto& e : pattern["epilogue_expr"]["ssa"]) {
    if (e["op"] == "slice_last") e["params"] = e["params"][0] == 0 ? json({0, 6}) : json({6, 6});
    if (e["op"] == "cat_last") e["params"] = {6, 6};
  }
  pattern["problem"]["cols"] = 12;
  EXPECT_EQ(PointwiseSpec::from_pattern(pattern).vec, 2);
}

TEST(PointwiseEmit, OperandsWhoseRowsMissVectorBoundariesAreReadStrided) {
  // sigmoid(x[..., :8] * y) with x [4, 12] bf16: 8-wide vectors, but x's rows are 12 apart.
  GraphBuilder b("bf16");
  b.input("x", T("bf16", {4, 12}));
  b.input("y", T("bf16", {4, 8}));
  b.call("s", "aten.slice.Tensor", {N("x"), -1, 0, 8}, T("bf16", {4, 8}, std::vector<int64_t>{12, 1}));
  b.call("m", "aten.mul.Tensor", {N("s"), N("y")}, T("bf16", {4, 8}));
  b.call("r", "aten.sigmoid.default", {N("m")}, T("bf16", {4, 8}));
  const auto p = plan(b);
  const auto* c = pointwise(p);
  ASSERT_NE(c, nullptr);
  json pattern = plan_pattern(p, *c);
  EXPECT_EQ(pattern["attrs"]["access"], json({"contiguous", "contiguous"}));  // as traced
  const auto spec = PointwiseSpec::from_pattern(pattern);
  EXPECT_EQ(spec.vec, 8);
  EXPECT_EQ(spec.access, (std::vector<std::string>{"strided", "contiguous"}));
}

TEST(PointwiseEmit, ParametersAndCastsBecomeLiterals) {
  json pattern = {
      {"family", "pointwise"},
      {"operands", {{{"role", "in0"}, {"node", "x"}, {"type", "f32[8, 32]"}}}},
      {"attrs", {{"dtype_out", "bf16"}, {"shape", {8, 32}}, {"strides", {32, 1}}}},
      {"problem", {{"numel", 256}, {"cols", 32}}},
      {"epilogue_expr",
       {{"text", "to_bf16(clamp(x, -inf, 0.5))"},
        {"ssa",
         {{{"id", 0}, {"op", "operand"}, {"index", 0}},
          {{"id", 1}, {"op", "clamp"}, {"args", {0}}, {"params", {"-inf", 0.5}}},
          {{"id", 2}, {"op", "cast"}, {"args", {1}}, {"dtype", "bf16"}}}}}}};
  const auto spec = PointwiseSpec::from_pattern(pattern);
  const auto k = realize::emit_pointwise(spec, realize::pointwise_configs(spec)[0]);
  EXPECT_NE(k.source.find("fact_clamp(v0[j], (-INFINITY), (0.5f))"), std::string::npos) << k.source;
  EXPECT_NE(k.source.find("round_to<__nv_bfloat16>(v1[j])"), std::string::npos);
  // Without access kinds (older plans) an input is read through its run-time stride.
  EXPECT_NE(k.source.find("load(in0, base[0], c, a.strides[0][a.rank - 1], v0);"), std::string::npos);
  pattern["attrs"]["access"] = {"broadcast"};
  const auto b = realize::emit_pointwise(PointwiseSpec::from_pattern(pattern), realize::pointwise_configs(spec)[0]);
  EXPECT_NE(b.source.find("load_broadcast(in0, base[0], v0);"), std::string::npos);
  pattern["attrs"]["access"] = {"sideways"};
  EXPECT_THROW(PointwiseSpec::from_pattern(pattern), NotSupported);
}

TEST(PointwiseEmit, RefusesWhatItCannotCompile) {
  const auto p = plan(rope_graph());
  const json good = plan_pattern(p, *pointwise(p));
  json unknown = good;
  unknown["epilogue_expr"]["ssa"][2]["op"] = "frobnicate";
  EXPECT_THROW(PointwiseSpec::from_pattern(unknown), NotSupported);
  json boolean = good;
  boolean["attrs"]["dtype_out"] = "bool";
  EXPECT_THROW(PointwiseSpec::from_pattern(boolean), NotSupported);
  json wide = good;
  for (int i = 3; i < 17; ++i) {
    wide["operands"].push_back({{"role", "in" + std::to_string(i)}, {"node", "x"}, {"type", "bf16[64]"}});
  }
  EXPECT_THROW(PointwiseSpec::from_pattern(wide), NotSupported);
  json ints = good;
  ints["operands"][1]["type"] = "i64[16, 64]";
  EXPECT_THROW(PointwiseSpec::from_pattern(ints), NotSupported);
  json out_of_range = good;
  out_of_range["epilogue_expr"]["ssa"][0]["index"] = 7;
  EXPECT_THROW(PointwiseSpec::from_pattern(out_of_range), NotSupported);
}

}  // namespace
}  // namespace fact::test
