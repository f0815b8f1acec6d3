// Each catalog rule through discover() on small traced-shaped graphs: what it matches, the
// sizes and attributes it records, and that nothing is silently dropped from the plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "discover/catalog.h"
#include "discover/planner.h"
#include "graph_builder.h"
#include "sample_graphs.h"

namespace fact::test {
namespace {

using discover::Family;
using Names = std::vector<std::string>;

json problem(int64_t batch, int64_t m, int64_t n, int64_t k) {
  return {{"batch", batch}, {"m", m}, {"n", n}, {"k", k}};
}

TEST(Catalog, EveryRuleHasRootsAndMath) {
  const auto& rules = discover::catalog();
  ASSERT_EQ(rules.size(), 8u);
  for (const auto& r : rules) {
    EXPECT_FALSE(r.roots.empty()) << r.name;
    EXPECT_FALSE(r.math.empty()) << r.name;
    EXPECT_TRUE(static_cast<bool>(r.match)) << r.name;
  }
}

// ---------------------------------------------------------------------------------------------
// gemm_epilogue

TEST(RuleGemm, MmWithTransposedWeightReadsItColumnMajor) {
  GraphBuilder b;
  b.input("x", T("f32", {64, 32}));
  b.param("w", T("f32", {48, 32}));
  b.call("wt", "aten.t.default", {N("w")}, T("f32", {32, 48}, std::vector<int64_t>{1, 32}));
  b.call("mm", "aten.mm.default", {N("x"), N("wt")}, T("f32", {64, 48}));
  const auto p = plan(b);
  const auto* m = only(p, Family::gemm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->rule, "gemm_epilogue");
  EXPECT_EQ(m->problem, problem(1, 64, 48, 32));
  EXPECT_EQ(m->attrs.at("layout_a"), "row");
  EXPECT_EQ(m->attrs.at("layout_b"), "col");
  EXPECT_EQ(m->attrs.at("dtype_a"), "f32");
  EXPECT_EQ(m->attrs.at("accumulate"), "f32");
  EXPECT_TRUE(m->epilogue.empty());
  EXPECT_EQ(names(p.g, m->nodes), Names({"mm"}));
  ASSERT_GE(m->operands.size(), 2u);
  EXPECT_EQ(m->operands[1].role, "b");
  EXPECT_EQ(p.g.node(m->operands[1].node).name, "wt");
  EXPECT_TRUE(p.d.uncovered.empty());
  EXPECT_EQ(names(p.g, p.d.free), Names({"wt"}));
  expect_nothing_dropped(p);
}

TEST(RuleGemm, MmWithTransposedActivationIsColumnMajorA) {
  GraphBuilder b;
  b.input("a", T("f32", {64, 32}));
  b.input("bm", T("f32", {64, 40}));
  b.call("at", "aten.t.default", {N("a")}, T("f32", {32, 64}, std::vector<int64_t>{1, 32}));
  b.call("mm", "aten.mm.default", {N("at"), N("bm")}, T("f32", {32, 40}));
  const auto p = plan(b);
  const auto* m = only(p, Family::gemm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->problem, problem(1, 32, 40, 64));
  EXPECT_EQ(m->attrs.at("layout_a"), "col");
  EXPECT_EQ(m->attrs.at("layout_b"), "row");
  expect_nothing_dropped(p);
}

TEST(RuleGemm, Bmm) {
  GraphBuilder b("bf16");
  b.input("a", T("bf16", {6, 32, 64}));
  b.input("bm", T("bf16", {6, 64, 40}));
  b.call("bmm", "aten.bmm.default", {N("a"), N("bm")}, T("bf16", {6, 32, 40}));
  const auto p = plan(b);
  const auto* m = only(p, Family::gemm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->problem, problem(6, 32, 40, 64));
  EXPECT_EQ(m->attrs.at("layout_a"), "row");
  EXPECT_EQ(m->attrs.at("layout_b"), "row");
  EXPECT_EQ(m->attrs.at("dtype_out"), "bf16");
  expect_nothing_dropped(p);
}

TEST(RuleGemm, MatmulBatched4d) {
  GraphBuilder b;
  b.input("a", T("f32", {2, 3, 32, 64}));
  b.input("bm", T("f32", {2, 3, 64, 40}));
  b.call("mat", "aten.matmul.default", {N("a"), N("bm")}, T("f32", {2, 3, 32, 40}));
  const auto p = plan(b);
  const auto* m = only(p, Family::gemm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->problem, problem(6, 32, 40, 64));
  expect_nothing_dropped(p);
}

TEST(RuleGemm, Matmul3dByWeightFoldsLeadingDimsIntoM) {
  GraphBuilder b;
  b.input("a", T("f32", {4, 8, 64}));
  b.param("w", T("f32", {48, 64}));
  b.call("wt", "aten.t.default", {N("w")}, T("f32", {64, 48}, std::vector<int64_t>{1, 64}));
  b.call("mat", "aten.matmul.default", {N("a"), N("wt")}, T("f32", {4, 8, 48}));
  const auto p = plan(b);
  const auto* m = only(p, Family::gemm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->problem, problem(1, 32, 48, 64));
  EXPECT_EQ(m->attrs.at("layout_b"), "col");
  expect_nothing_dropped(p);
}

TEST(RuleGemm, MatmulBatchedWithTransposedB) {
  GraphBuilder b;
  b.input("a", T("f32", {5, 32, 64}));
  b.input("bm", T("f32", {5, 40, 64}));
  b.call("bt", "aten.transpose.int", {N("bm"), -2, -1}, T("f32", {5, 64, 40}, std::vector<int64_t>{2560, 1, 64}));
  b.call("mat", "aten.matmul.default", {N("a"), N("bt")}, T("f32", {5, 32, 40}));
  const auto p = plan(b);
  const auto* m = only(p, Family::gemm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->problem, problem(5, 32, 40, 64));
  EXPECT_EQ(m->attrs.at("layout_b"), "col");
  expect_nothing_dropped(p);
}

GraphBuilder addmm_graph(const json& kwargs) {
  GraphBuilder b;
  b.input("x", T("f32", {32, 64}));
  b.param("w", T("f32", {48, 64}));
  b.param("bias", T("f32", {48}));
  b.call("wt", "aten.t.default", {N("w")}, T("f32", {64, 48}, std::vector<int64_t>{1, 64}));
  b.call("addmm", "aten.addmm.default", {N("bias"), N("x"), N("wt")}, T("f32", {32, 48}), kwargs);
  return b;
}

TEST(RuleGemm, AddmmBiasIsAnEpilogueStep) {
  const auto p = plan(addmm_graph(json::object()));
  const auto* m = only(p, Family::gemm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->problem, problem(1, 32, 48, 64));
  EXPECT_EQ(m->epilogue, Names({"bias"}));
  EXPECT_EQ(m->epilogue_expr.at("text"), "acc + bias");
  expect_nothing_dropped(p);
}

TEST(RuleGemm, AddmmAlphaBetaScaleTheProductAndTheBias) {
  const auto p = plan(addmm_graph({{"beta", 0.5}, {"alpha", 2.0}}));
  const auto* m = only(p, Family::gemm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->problem, problem(1, 32, 48, 64));
  EXPECT_EQ(m->epilogue_expr.at("text"), "(acc * 2) + (bias * 0.5)");
  ASSERT_EQ(m->operands.size(), 3u);
  EXPECT_EQ(m->operands[2].role, "bias");
  EXPECT_EQ(m->operands[2].broadcast, "row");
  expect_nothing_dropped(p);
}

// The step names are the --json contract (tests/python/test_discover_patterns.py expects
// ["scale", "scale", "bias"] for this module): the beta-scaled bias add is a bias step.
TEST(RuleGemm, AddmmAlphaBetaStepNames) {
  const auto p = plan(addmm_graph({{"beta", 0.5}, {"alpha", 2.0}}));
  const auto* m = only(p, Family::gemm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->epilogue, Names({"scale", "scale", "bias"}));
}

TEST(RuleGemm, LinearWithTailIsOnePattern) {
  GraphBuilder b("bf16");
  b.input("x", T("bf16", {4, 16, 64}));
  b.param("w", T("bf16", {48, 64}));
  b.param("bias", T("bf16", {48}));
  b.call("lin", "aten.linear.default", {N("x"), N("w"), N("bias")}, T("bf16", {4, 16, 48}));
  b.call("r", "aten.relu.default", {N("lin")}, T("bf16", {4, 16, 48}));
  const auto p = plan(b);
  const auto* m = only(p, Family::gemm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->problem, problem(1, 64, 48, 64));
  EXPECT_EQ(m->epilogue, Names({"bias", "relu"}));
  EXPECT_EQ(names(p.g, m->nodes), Names({"lin", "r"}));
  EXPECT_EQ(p.g.node(m->output).name, "r");
  EXPECT_EQ(m->attrs.at("layout_b"), "col");
  expect_nothing_dropped(p);
}

TEST(RuleGemm, MatrixVectorProductIsAMiss) {
  GraphBuilder b;
  b.input("a", T("f32", {32, 64}));
  b.input("v", T("f32", {64}));
  b.call("mv", "aten.matmul.default", {N("a"), N("v")}, T("f32", {32}));
  const auto p = plan(b);
  EXPECT_TRUE(p.d.chosen.empty());
  EXPECT_TRUE(has_miss(p, "gemm_epilogue", "matrix-vector product"));
  EXPECT_EQ(names(p.g, p.d.uncovered), Names({"mv"}));
  expect_nothing_dropped(p);
}

// ---------------------------------------------------------------------------------------------
// horizontal_gemm

GraphBuilder qkv_graph(const std::string& dt) {
  GraphBuilder b(dt);
  b.input("x", T(dt, {16, 64}));
  const std::vector<std::pair<std::string, int64_t>> parts = {{"q", 64}, {"k", 32}, {"v", 32}};
  for (const auto& [name, n] : parts) {
    b.param("w" + name, T(dt, {n, 64}));
    b.param("b" + name, T(dt, {n}));
  }
  for (const auto& [name, n] : parts) {
    b.call(name, "aten.linear.default", {N("x"), N("w" + name), N("b" + name)}, T(dt, {16, n}));
  }
  b.outputs({"q", "k", "v"});
  return b;
}

TEST(RuleHorizontal, ThreeLinearsSharingXBecomeOneGemm) {
  for (const std::string dt : {"f32", "bf16"}) {
    SCOPED_TRACE(dt);
    const auto p = plan(qkv_graph(dt));
    const auto* m = only(p, Family::horizontal_gemm);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->rule, "horizontal_gemm");
    EXPECT_EQ(p.g.node(m->root).name, "q");  // anchored at the first
    EXPECT_EQ(names(p.g, m->nodes), Names({"q", "k", "v"}));
    EXPECT_EQ(m->problem.at("m"), 16);
    EXPECT_EQ(m->problem.at("k"), 64);
    EXPECT_EQ(m->problem.at("n"), 128);
    EXPECT_EQ(m->problem.at("n_parts"), json::array({64, 32, 32}));
    EXPECT_EQ(m->epilogue, Names({"bias"}));
    EXPECT_EQ(m->attrs.at("parts"), json::array({"q", "k", "v"}));
    EXPECT_EQ(m->attrs.at("dtype_a"), dt);
    EXPECT_TRUE(chosen_of(p, Family::gemm).empty());
    EXPECT_TRUE(has_miss(p, "horizontal_gemm", "anchored at the group's first GEMM"));
    EXPECT_EQ(p.d.rule_hits.at("horizontal_gemm"), 1);
    EXPECT_EQ(p.d.rule_hits.at("gemm_epilogue"), 3);
    expect_nothing_dropped(p);
  }
}

// GPT-J's block: q, k, v and the MLP's fc_in all read x, and fc_in goes into a GELU. The group
// of all four would leave the GELU to PyTorch; the group of q, k and v is a second candidate, and
// fc_in a GEMM with the GELU in its epilogue.
TEST(RuleHorizontal, APartWithAPointwiseTailIsAlsoLeftOutOfTheGroup) {
  GraphBuilder b = qkv_graph("bf16");
  b.param("wf", T("bf16", {256, 64}));
  b.param("bf", T("bf16", {256}));
  b.call("f", "aten.linear.default", {N("x"), N("wf"), N("bf")}, T("bf16", {16, 256}));
  b.call("g", "aten.gelu.default", {N("f")}, T("bf16", {16, 256}), {{"approximate", "tanh"}});
  b.outputs({"q", "k", "v", "g"});
  const auto p = plan(b);
  const auto* m = only(p, Family::horizontal_gemm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(names(p.g, m->nodes), Names({"q", "k", "v"}));
  EXPECT_EQ(m->problem.at("n"), 128);
  const auto* f = only(p, Family::gemm);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(names(p.g, f->nodes), Names({"f", "g"}));
  EXPECT_EQ(f->epilogue, Names({"bias", "gelu_tanh"}));
  EXPECT_TRUE(p.d.uncovered.empty());
  // Both groups were candidates.
  EXPECT_EQ(p.d.rule_hits.at("horizontal_gemm"), 2);
  expect_nothing_dropped(p);
}

TEST(RuleHorizontal, GemmsReadingDifferentInputsDoNotGroup) {
  GraphBuilder b;
  b.input("x", T("f32", {16, 64}));
  b.input("x2", T("f32", {16, 32}));
  b.param("w1", T("f32", {8, 64}));
  b.param("w2", T("f32", {8, 32}));
  b.call("l1", "aten.linear.default", {N("x"), N("w1")}, T("f32", {16, 8}));
  b.call("l2", "aten.linear.default", {N("x2"), N("w2")}, T("f32", {16, 8}));
  b.outputs({"l1", "l2"});
  const auto p = plan(b);
  EXPECT_TRUE(chosen_of(p, Family::horizontal_gemm).empty());
  EXPECT_EQ(chosen_of(p, Family::gemm).size(), 2u);
  EXPECT_TRUE(has_miss(p, "horizontal_gemm", "no other GEMM reads 'x'"));
  expect_nothing_dropped(p);
}

// ---------------------------------------------------------------------------------------------
// gated_mlp

void expect_gated(const Planned& p, const std::string& act) {
  const auto* m = only(p, Family::gated_mlp);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->rule, "gated_mlp");
  EXPECT_EQ(m->epilogue, Names({act, "mul"}));
  EXPECT_EQ(m->problem, problem(1, 16, 96, 64));
  EXPECT_EQ(m->attrs.at("activation"), act);
  EXPECT_EQ(m->attrs.at("gate"), "h1");
  EXPECT_EQ(m->attrs.at("up"), "h3");
  EXPECT_EQ(p.g.node(m->output).name, "out");
  ASSERT_EQ(m->operands.size(), 3u);
  EXPECT_EQ(p.g.node(m->operands[1].node).name, "w1");
  EXPECT_EQ(p.g.node(m->operands[2].node).name, "w3");
  EXPECT_EQ(p.d.chosen.size(), 1u);
  EXPECT_TRUE(p.d.uncovered.empty());
  expect_nothing_dropped(p);
}

TEST(RuleGatedMlp, SiluGateTimesUp) {
  const auto p = plan(gated_mlp_graph("f32", "silu"));
  expect_gated(p, "silu");
  EXPECT_EQ(names(p.g, p.d.chosen[0].match.nodes), Names({"h1", "a", "h3", "out"}));
}

TEST(RuleGatedMlp, FactorsSwapped) { expect_gated(plan(gated_mlp_graph("f32", "silu", true)), "silu"); }

TEST(RuleGatedMlp, Bf16) { expect_gated(plan(gated_mlp_graph("bf16", "silu")), "silu"); }

TEST(RuleGatedMlp, HandWrittenSilu) {
  const auto p = plan(gated_mlp_graph("f32", "silu_by_hand"));
  expect_gated(p, "silu");
  EXPECT_EQ(names(p.g, p.d.chosen[0].match.nodes), Names({"h1", "sg", "a", "h3", "out"}));
}

TEST(RuleGatedMlp, GeluGate) { expect_gated(plan(gated_mlp_graph("f32", "gelu")), "gelu_erf"); }

TEST(RuleGatedMlp, ProjectionsWithABiasArePlannedAsGemms) {
  // silu(x W1^T + b1) * (x W3^T + b3): no gated form adds biases, so the GEMM rules take the
  // two linears (the gate's tail reading the up projection), rather than a gated pattern no
  // implementation can run
  GraphBuilder b;
  const json t = T("f32", {16, 96});
  b.input("x", T("f32", {16, 64}));
  for (const char* w : {"w1", "w3"}) b.param(w, T("f32", {96, 64}));
  for (const char* bias : {"b1", "b3"}) b.param(bias, T("f32", {96}));
  b.call("h1", "aten.linear.default", {N("x"), N("w1"), N("b1")}, t);
  b.call("a", "aten.silu.default", {N("h1")}, t);
  b.call("h3", "aten.linear.default", {N("x"), N("w3"), N("b3")}, t);
  b.call("out", "aten.mul.Tensor", {N("a"), N("h3")}, t);
  const auto p = plan(b);
  EXPECT_TRUE(chosen_of(p, Family::gated_mlp).empty());
  EXPECT_TRUE(has_miss(p, "gated_mlp", "'h1' or 'h3' adds a bias, which the gated forms do not"));
  size_t gemms = 0;
  for (const auto& c : p.d.chosen) gemms += c.match.family == Family::gemm ? 1 : 0;
  EXPECT_EQ(gemms, 2u);
  EXPECT_TRUE(p.d.uncovered.empty());
}

TEST(RuleGatedMlp, UpProjectionUsedElsewhereIsAMiss) {
  auto b = gated_mlp_graph();
  b.outputs({"out", "h3"});
  const auto p = plan(b);
  EXPECT_TRUE(chosen_of(p, Family::gated_mlp).empty());
  EXPECT_TRUE(has_miss(p, "gated_mlp", "'h3' is also used outside the product"));
  expect_nothing_dropped(p);
}

// ---------------------------------------------------------------------------------------------
// attention

void expect_attention_problem(const discover::Match& m, int64_t heads, int64_t kv_heads) {
  EXPECT_EQ(m.problem.at("batch"), 2);
  EXPECT_EQ(m.problem.at("heads"), heads);
  EXPECT_EQ(m.problem.at("kv_heads"), kv_heads);
  EXPECT_EQ(m.problem.at("seq_q"), 16);
  EXPECT_EQ(m.problem.at("seq_k"), 16);
  EXPECT_EQ(m.problem.at("head_dim"), 8);
  EXPECT_EQ(m.problem.at("head_dim_v"), 8);
}

// Scores with an additive bias (T5's position bias, BERT's padding mask): `order` "scale_first"
// adds it to the scaled scores (SDPA's attn_mask), "bias_first" scales the sum, bias included,
// "alpha" adds it scaled (add's alpha = 2), "causal_first" masks the scores causally with
// finfo(f32).min, scales them by `scale`, then adds the bias (a decoder's padding mask).
// Inputs q, k, v of [2, 4, 16, 8] (f32): the attention graphs below start from them.
const json kQkv = T("f32", {2, 4, 16, 8});
const json kScores = T("f32", {2, 4, 16, 16});
GraphBuilder qkv_inputs() {
  GraphBuilder b;
  for (const char* name : {"q", "k", "v"}) b.input(name, kQkv);
  return b;
}

GraphBuilder biased_attention_graph(const std::string& order, double scale = 0.5) {
  GraphBuilder b = qkv_inputs();
  const json& qkv = kQkv;
  const json& scores = kScores;
  b.input("pad", T("f32", {2, 1, 1, 16}));
  b.call("kt", "aten.transpose.int", {N("k"), -2, -1}, T("f32", {2, 4, 8, 16}, std::vector<int64_t>{512, 128, 1, 8}));
  b.call("s", "aten.matmul.default", {N("q"), N("kt")}, scores);
  if (order == "causal_first") {
    b.buffer("tril", T("bool", {16, 16}), {{"tril", true}});
    b.call("eqm", "aten.eq.Scalar", {N("tril"), 0}, T("bool", {16, 16}));
    b.call("mf", "aten.masked_fill.Scalar", {N("s"), N("eqm"), -3.4028234663852886e38}, scores);
    b.call("sc", "aten.mul.Tensor", {N("mf"), scale}, scores);
    b.call("biased", "aten.add.Tensor", {N("sc"), N("pad")}, scores);
  } else if (order == "scale_first" || order == "alpha") {
    b.call("sc", "aten.mul.Tensor", {N("s"), 0.5}, scores);
    if (order == "alpha") {
      b.call("biased", "aten.add.Tensor", {N("sc"), N("pad")}, scores, {{"alpha", 2.0}});
    } else {
      b.call("biased", "aten.add.Tensor", {N("sc"), N("pad")}, scores);
    }
  } else {
    b.call("sb", "aten.add.Tensor", {N("pad"), N("s")}, scores);
    b.call("biased", "aten.mul.Tensor", {N("sb"), 0.5}, scores);
  }
  b.call("sm", "aten._softmax.default", {N("biased"), -1, false}, scores);
  b.call("o", "aten.matmul.default", {N("sm"), N("v")}, qkv);
  return b;
}

TEST(RuleAttention, AnAdditiveScoreBiasIsAnOperand) {
  const auto p = plan(biased_attention_graph("scale_first"));
  const auto* m = only(p, Family::attention);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->epilogue, Names({"scale", "bias", "softmax"}));
  ASSERT_EQ(m->operands.size(), 4u);
  EXPECT_EQ(m->operands[3].role, "bias");
  EXPECT_EQ(p.g.node(m->operands[3].node).name, "pad");
  EXPECT_EQ(m->attrs.at("bias_shape"), json({2, 1, 1, 16}));
  EXPECT_FALSE(m->attrs.at("causal").get<bool>());
  EXPECT_DOUBLE_EQ(m->attrs.at("scale").get<double>(), 0.5);
  expect_nothing_dropped(p);
}

TEST(RuleAttention, ABiasUnderACausalMaskKeepsTheMasksFloor) {
  // SDPA takes the two as one attn_mask; where the bias masks a whole row, the graph's floor
  // (finfo.min here, halved by the scale after it) decides what the row attends to.
  const auto p = plan(biased_attention_graph("causal_first"));
  const auto* m = only(p, Family::attention);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->epilogue, Names({"causal_mask", "scale", "bias", "softmax"}));
  EXPECT_TRUE(m->attrs.at("causal").get<bool>());
  EXPECT_EQ(m->attrs.at("mask_floor"), "-1.7014117331926443e+38");
  EXPECT_EQ(std::stod(m->attrs.at("mask_floor").get<std::string>()), -3.4028234663852886e38 * 0.5);
  // Without a bias there is no floor to keep: is_causal says it all.
  const auto* plain = only(plan(attention_graph("tril")), Family::attention);
  ASSERT_NE(plain, nullptr);
  EXPECT_FALSE(plain->attrs.contains("mask_floor"));
  expect_nothing_dropped(p);
}

TEST(RuleAttention, ANegativeScaleAfterTheCausalMaskIsAMiss) {
  const auto p = plan(biased_attention_graph("causal_first", -0.5));  // finfo.min * -0.5 > 0
  EXPECT_TRUE(chosen_of(p, Family::attention).empty());
  EXPECT_TRUE(has_miss(p, "attention_handwritten", "a scale by a factor <= 0 after the causal mask unmasks it"));
}

TEST(RuleAttention, ABiasAddedWithAnAlphaIsNoBias) {
  const auto p = plan(biased_attention_graph("alpha"));
  EXPECT_TRUE(chosen_of(p, Family::attention).empty());
  EXPECT_TRUE(has_miss(p, "attention_handwritten", "'biased' (aten.add.Tensor) is not a cast"));
}

TEST(RuleAttention, AttentionOutputReadTwiceIsAMiss) {
  // o's heads are merged back by a view the pattern takes in; a sum reads o itself
  GraphBuilder b = biased_attention_graph("scale_first");
  b.call("ot", "aten.transpose.int", {N("o"), 1, 2}, T("f32", {2, 16, 4, 8}, std::vector<int64_t>{512, 8, 128, 1}));
  b.call("total", "aten.sum.default", {N("o")}, T("f32", {}));
  b.outputs({"ot", "total"});
  const auto p = plan(b);
  EXPECT_TRUE(chosen_of(p, Family::attention).empty());
  EXPECT_TRUE(has_miss(p, "attention_handwritten", "also reads 'o' inside the attention"));
}

TEST(RuleAttention, ABiasAddedBeforeTheScaleIsAMiss) {
  const auto p = plan(biased_attention_graph("bias_first"));
  EXPECT_TRUE(chosen_of(p, Family::attention).empty());
  EXPECT_TRUE(has_miss(p, "attention_handwritten", "the score bias 'pad' is added before a scale"));
}

TEST(RuleAttention, HandWrittenWithTrilBufferMask) {
  const auto p = plan(attention_graph("tril"));
  const auto* m = only(p, Family::attention);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->rule, "attention_handwritten");
  EXPECT_EQ(p.g.node(m->root).name, "sm");
  EXPECT_EQ(m->epilogue, Names({"scale", "causal_mask", "softmax"}));
  expect_attention_problem(*m, 4, 4);
  EXPECT_EQ(m->attrs.at("causal"), true);
  EXPECT_NEAR(m->attrs.at("scale").get<double>(), 1.0 / std::sqrt(8.0), 1e-12);
  EXPECT_EQ(m->attrs.at("softmax_dtype"), "f32");
  EXPECT_EQ(m->attrs.at("q_source"), "q");
  EXPECT_EQ(m->attrs.at("k_source"), "k");
  EXPECT_EQ(m->attrs.at("v_source"), "v");
  EXPECT_EQ(m->attrs.at("k_strides"), json::array({512, 128, 8, 1}));  // K's own layout, not K^T's
  EXPECT_EQ(m->attrs.at("out_layout"), "bhsd");
  EXPECT_EQ(names(p.g, m->nodes), Names({"kt", "s", "sc", "eqm", "mf", "sm", "o"}));
  EXPECT_EQ(p.g.node(m->output).name, "o");
  EXPECT_EQ(p.d.chosen.size(), 1u);
  EXPECT_TRUE(p.d.uncovered.empty());
  expect_nothing_dropped(p);
}

TEST(RuleAttention, HandWrittenWithAdditiveTriuMask) {
  for (const std::string mask : {"additive", "finfo"}) {  // -inf or finfo.min above the diagonal
    const auto p = plan(attention_graph(mask, -1, "bf16"));
    const auto* m = only(p, Family::attention);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->epilogue, Names({"scale", "causal_mask", "softmax"}));
    EXPECT_EQ(m->attrs.at("causal"), true);
    EXPECT_EQ(m->attrs.at("dtype"), "bf16");
    expect_attention_problem(*m, 4, 4);
    // The mask's full and triu are computed inside the kernel: absorbed.
    EXPECT_EQ(names(p.g, m->nodes), Names({"kt", "s", "sc", "full", "tu", "mf", "sm", "o"}));
    EXPECT_TRUE(p.d.uncovered.empty());
    expect_nothing_dropped(p);
  }
}

TEST(RuleAttention, HuggingFaceFormsOfTheScaleAndTheMask) {
  // GPT-2: scores / torch.full([], 8.0), then torch.where(tril, scores, torch.full([], finfo.min));
  // with `fill` "-1e4" the floor does not mask a bf16 score out, and the rule misses.
  for (const std::string fill : {"finfo", "-1e4"}) {
    GraphBuilder b("bf16");
    const json qkv = T("bf16", {2, 4, 16, 8});
    const json scores = T("bf16", {2, 4, 16, 16});
    for (const char* name : {"q", "k", "v"}) b.input(name, qkv);
    b.buffer("tril", T("bool", {1, 1, 16, 16}), {{"tril", true}});
    b.call("kt", "aten.transpose.int", {N("k"), -2, -1}, T("bf16", {2, 4, 8, 16}, std::vector<int64_t>{512, 128, 1, 8}));
    b.call("s", "aten.matmul.default", {N("q"), N("kt")}, scores);
    b.call("d", "aten.full.default", {L({}), 8.0}, T("bf16", {}), {{"dtype", DTypeArg("bf16")}});
    b.call("sc", "aten.div.Tensor", {N("s"), N("d")}, scores);
    const double floor = fill == "finfo" ? -3.3895313892515355e38 : -1e4;
    b.call("lo", "aten.full.default", {L({}), floor}, T("bf16", {}), {{"dtype", DTypeArg("bf16")}});
    b.call("w", "aten.where.self", {N("tril"), N("sc"), N("lo")}, scores);
    b.call("sm", "aten._softmax.default", {N("w"), -1, false}, scores);
    b.call("o", "aten.matmul.default", {N("sm"), N("v")}, qkv);
    const auto p = plan(b);
    if (fill == "-1e4") {
      EXPECT_TRUE(chosen_of(p, Family::attention).empty());
      EXPECT_TRUE(has_miss(p, "attention_handwritten", "'w' (aten.where.self) is not a cast"));
      continue;
    }
    const auto* m = only(p, Family::attention);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->epilogue, Names({"scale", "causal_mask", "softmax"}));
    EXPECT_TRUE(m->attrs.at("causal").get<bool>());
    EXPECT_DOUBLE_EQ(m->attrs.at("scale").get<double>(), 0.125);
    EXPECT_EQ(names(p.g, m->nodes), Names({"kt", "s", "d", "sc", "lo", "w", "sm", "o"}));
    EXPECT_TRUE(p.d.uncovered.empty());
    expect_nothing_dropped(p);
  }
}

TEST(RuleAttention, WhereWithTrilBufferAndScaleOnQ) {
  GraphBuilder b = qkv_inputs();
  const json& qkv = kQkv;
  const json& scores = kScores;
  b.buffer("tril", T("bool", {16, 16}), {{"tril", true}});
  b.call("qs", "aten.div.Tensor", {N("q"), std::sqrt(8.0)}, qkv);
  b.call("kt", "aten.transpose.int", {N("k"), -2, -1}, T("f32", {2, 4, 8, 16}, std::vector<int64_t>{512, 128, 1, 8}));
  b.call("s", "aten.matmul.default", {N("qs"), N("kt")}, scores);
  b.call("w", "aten.where.ScalarOther", {N("tril"), N("s"), Float("-inf")}, scores);
  b.call("sm", "aten._softmax.default", {N("w"), -1, false}, scores);
  b.call("o", "aten.matmul.default", {N("sm"), N("v")}, qkv);
  const auto p = plan(b);
  const auto* m = only(p, Family::attention);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->epilogue, Names({"scale", "causal_mask", "softmax"}));
  EXPECT_NEAR(m->attrs.at("scale").get<double>(), 1.0 / std::sqrt(8.0), 1e-12);
  EXPECT_EQ(m->attrs.at("q_source"), "q");
  EXPECT_TRUE(p.d.uncovered.empty());
  expect_nothing_dropped(p);
}

// masked_fill(scores, mask, -inf) with the mask made from a bool tril buffer by `how`: "not"
// (~tril, aten.bitwise_not: the upper triangle) or "transposed_not" (~tril.t(): the lower one,
// an anti-causal mask).
GraphBuilder masked_by_bool_tril(const std::string& how) {
  GraphBuilder b = qkv_inputs();
  b.buffer("tril", T("bool", {16, 16}), {{"tril", true}});
  std::string src = "tril";
  const json flipped = T("bool", {16, 16}, std::vector<int64_t>{1, 16});
  if (how == "transposed_not") {
    b.call("trt", "aten.t.default", {N("tril")}, flipped);
    src = "trt";
  } else if (how == "transpose_not") {
    b.call("trt", "aten.transpose.int", {N("tril"), -2, -1}, flipped);
    src = "trt";
  } else if (how == "permute_not") {
    b.call("trt", "aten.permute.default", {N("tril"), L({1, 0})}, flipped);
    src = "trt";
  } else if (how == "outer_permute_not") {  // moves the leading dims only: the same mask
    b.call("tv", "aten.view.default", {N("tril"), L({1, 1, 16, 16})}, T("bool", {1, 1, 16, 16}));
    b.call("tp", "aten.permute.default", {N("tv"), L({1, 0, 2, 3})}, T("bool", {1, 1, 16, 16}));
    b.call("trt", "aten.view.default", {N("tp"), L({16, 16})}, T("bool", {16, 16}));
    src = "trt";
  }
  b.call("notm", "aten.bitwise_not.default", {N(src)}, T("bool", {16, 16}));
  b.call("kt", "aten.transpose.int", {N("k"), -2, -1}, T("f32", {2, 4, 8, 16}, std::vector<int64_t>{512, 128, 1, 8}));
  b.call("s", "aten.matmul.default", {N("q"), N("kt")}, kScores);
  b.call("mf", "aten.masked_fill.Scalar", {N("s"), N("notm"), Float("-inf")}, kScores);
  b.call("sm", "aten._softmax.default", {N("mf"), -1, false}, kScores);
  b.call("o", "aten.matmul.default", {N("sm"), N("v")}, kQkv);
  return b;
}

TEST(RuleAttention, NotOfABoolTrilIsTheCausalMask) {
  for (const std::string how : {"not", "outer_permute_not"}) {
    const auto p = plan(masked_by_bool_tril(how));
    const auto* m = only(p, Family::attention);
    ASSERT_NE(m, nullptr) << how;
    EXPECT_EQ(m->epilogue, Names({"causal_mask", "softmax"}));
    EXPECT_TRUE(p.d.uncovered.empty()) << how;  // ~tril goes with the pattern
    expect_nothing_dropped(p);
  }
}

TEST(RuleAttention, ATransposedTrilIsNoCausalMask) {
  // ~tril.t() keeps the keys at or after the query: planned as causal, it would compute the
  // opposite mask
  for (const std::string how : {"transposed_not", "transpose_not", "permute_not"}) {
    const auto p = plan(masked_by_bool_tril(how));
    EXPECT_TRUE(chosen_of(p, Family::attention).empty()) << how;
    EXPECT_TRUE(has_miss(p, "attention_handwritten", "'mf' (aten.masked_fill.Scalar) is not a cast")) << how;
  }
}

TEST(RuleAttention, SdpaCausalWithGqaThroughUnsqueezeExpandReshape) {
  GraphBuilder b("bf16");
  b.input("q", T("bf16", {2, 8, 16, 8}));
  b.input("k", T("bf16", {2, 2, 16, 8}));
  b.input("v", T("bf16", {2, 2, 16, 8}));
  for (const std::string t : {"k", "v"}) {
    b.call(t + "1", "aten.unsqueeze.default", {N(t), 2}, T("bf16", {2, 2, 1, 16, 8}, std::vector<int64_t>{256, 128, 128, 8, 1}));
    b.call(t + "2", "aten.expand.default", {N(t + "1"), L({2, 2, 4, 16, 8})},
           T("bf16", {2, 2, 4, 16, 8}, std::vector<int64_t>{256, 128, 0, 8, 1}));
    b.call(t + "3", "aten.reshape.default", {N(t + "2"), L({2, 8, 16, 8})}, T("bf16", {2, 8, 16, 8}));
  }
  b.call("at", "aten.scaled_dot_product_attention.default", {N("q"), N("k3"), N("v3")}, T("bf16", {2, 8, 16, 8}),
         {{"is_causal", true}});
  b.call("ot", "aten.transpose.int", {N("at"), 1, 2}, T("bf16", {2, 16, 8, 8}, std::vector<int64_t>{1024, 8, 128, 1}));
  b.call("o", "aten.reshape.default", {N("ot"), L({2, 16, 64})}, T("bf16", {2, 16, 64}));
  const auto p = plan(b);
  const auto* m = only(p, Family::attention);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->rule, "attention_sdpa");
  EXPECT_EQ(m->epilogue, Names({"scale", "causal_mask", "softmax"}));
  expect_attention_problem(*m, 8, 2);
  EXPECT_EQ(m->attrs.at("causal"), true);
  EXPECT_NEAR(m->attrs.at("scale").get<double>(), 1.0 / std::sqrt(8.0), 1e-12);
  EXPECT_EQ(m->attrs.at("k_source"), "k");
  EXPECT_EQ(m->attrs.at("v_source"), "v");
  EXPECT_EQ(m->attrs.at("out_layout"), "bs(hd)");
  EXPECT_EQ(p.g.node(m->output).name, "o");
  EXPECT_EQ(names(p.g, m->nodes), Names({"k1", "k2", "k3", "v1", "v2", "v3", "at", "ot", "o"}));
  EXPECT_TRUE(p.d.uncovered.empty());
  expect_nothing_dropped(p);
}

TEST(RuleAttention, SdpaExplicitScaleAndNoMask) {
  GraphBuilder b;
  const json t = T("f32", {2, 4, 16, 8});
  b.input("q", t);
  b.input("k", t);
  b.input("v", t);
  b.call("at", "aten.scaled_dot_product_attention.default", {N("q"), N("k"), N("v")}, t, {{"scale", 0.125}});
  const auto p = plan(b);
  const auto* m = only(p, Family::attention);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->epilogue, Names({"scale", "softmax"}));
  EXPECT_EQ(m->attrs.at("causal"), false);
  EXPECT_DOUBLE_EQ(m->attrs.at("scale").get<double>(), 0.125);
  expect_attention_problem(*m, 4, 4);
  expect_nothing_dropped(p);
}

TEST(RuleAttention, QReadsTheCopyThatAContiguousMakes) {
  // nn.MultiheadAttention's packed in-projection: a transposed view, then .contiguous(), a copy
  // whose strides are not the source's. Q is read from the copy; an identity contiguous of K is
  // stepped over.
  GraphBuilder b;
  const json t = T("f32", {2, 4, 16, 8});
  b.input("x", T("f32", {2, 16, 4, 8}));
  b.input("k", t);
  b.input("v", t);
  b.call("xt", "aten.transpose.int", {N("x"), 1, 2}, T("f32", {2, 4, 16, 8}, std::vector<int64_t>{512, 8, 32, 1}));
  b.call("q", "aten.contiguous.default", {N("xt")}, t);
  b.call("kc", "aten.contiguous.default", {N("k")}, t);
  b.call("at", "aten.scaled_dot_product_attention.default", {N("q"), N("kc"), N("v")}, t);
  const auto p = plan(b);
  const auto* m = only(p, Family::attention);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(p.g.node(m->operands[0].node).name, "q");
  EXPECT_EQ(p.g.node(m->operands[1].node).name, "k");
  EXPECT_EQ(names(p.g, m->nodes), Names({"kc", "at"}));
  EXPECT_EQ(m->attrs.at("q_strides"), json({512, 128, 8, 1}));
  expect_nothing_dropped(p);
}

TEST(RuleAttention, SdpaWithDropoutIsAMiss) {
  GraphBuilder b;
  const json t = T("f32", {2, 4, 16, 8});
  b.input("q", t);
  b.input("k", t);
  b.input("v", t);
  b.call("at", "aten.scaled_dot_product_attention.default", {N("q"), N("k"), N("v"), None, 0.1}, t);
  const auto p = plan(b);
  EXPECT_TRUE(p.d.chosen.empty());
  EXPECT_TRUE(has_miss(p, "attention_sdpa", "dropout_p > 0"));
  EXPECT_EQ(names(p.g, p.d.uncovered), Names({"at"}));
}

TEST(RuleAttention, SoftmaxOverAnotherDimIsAMiss) {
  const auto p = plan(attention_graph("tril", 1));
  EXPECT_TRUE(chosen_of(p, Family::attention).empty());
  EXPECT_EQ(p.d.rule_hits.count("attention_handwritten"), 0u);
  EXPECT_TRUE(has_miss(p, "attention_handwritten", "softmax is not over the last dim"));
  // The two products still run as GEMMs; the mask becomes one pointwise region and the
  // softmax stays in PyTorch.
  EXPECT_EQ(chosen_of(p, Family::gemm).size(), 2u);
  const auto regions = chosen_of(p, Family::pointwise);
  ASSERT_EQ(regions.size(), 1u);
  EXPECT_EQ(names(p.g, regions[0]->match.nodes), Names({"eqm", "mf"}));
  EXPECT_EQ(names(p.g, p.d.uncovered), Names({"sm"}));
  expect_nothing_dropped(p);
}

TEST(RuleAttention, ProbabilitiesUsedElsewhereIsAMiss) {
  auto b = attention_graph("tril");
  b.outputs({"o", "sm"});
  const auto p = plan(b);
  EXPECT_TRUE(chosen_of(p, Family::attention).empty());
  EXPECT_TRUE(has_miss(p, "attention_handwritten", "probabilities are also used elsewhere"));
  expect_nothing_dropped(p);
}

// ---------------------------------------------------------------------------------------------
// norms

TEST(RuleNorm, LayerNormOp) {
  GraphBuilder b;
  b.input("x", T("f32", {4, 8, 64}));
  b.param("w", T("f32", {64}));
  b.param("bias", T("f32", {64}));
  b.call("ln", "aten.layer_norm.default", {N("x"), L({64}), N("w"), N("bias"), 1e-5}, T("f32", {4, 8, 64}));
  const auto p = plan(b);
  const auto* m = only(p, Family::norm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->rule, "norm");
  EXPECT_EQ(m->attrs.at("kind"), "layer_norm");
  EXPECT_DOUBLE_EQ(m->attrs.at("eps").get<double>(), 1e-5);
  EXPECT_EQ(m->epilogue, Names({"weight", "bias"}));
  EXPECT_EQ(m->problem, json({{"rows", 32}, {"cols", 64}}));
  EXPECT_EQ(names(p.g, m->nodes), Names({"ln"}));
  expect_nothing_dropped(p);
}

TEST(RuleNorm, LayerNormWithoutAffine) {
  GraphBuilder b;
  b.input("x", T("f32", {4, 8, 64}));
  b.call("ln", "aten.layer_norm.default", {N("x"), L({64}), None, None, 1e-6}, T("f32", {4, 8, 64}));
  const auto p = plan(b);
  const auto* m = only(p, Family::norm);
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->epilogue.empty());
  EXPECT_DOUBLE_EQ(m->attrs.at("eps").get<double>(), 1e-6);
}

// native_layer_norm read for its mean and rstd alone (fact/folds.py folds the LayerNorm into the
// GEMMs after it): a statistics pattern with two outputs, its input cast absorbed.
GraphBuilder row_stats_graph(bool with_weight) {
  GraphBuilder b;
  const json f = T("f32", {4, 8, 64});
  const json col = T("f32", {4, 8, 1});
  b.input("x", T("bf16", {4, 8, 64}));
  b.param("w", T("f32", {64}));
  b.call("xf", "aten._to_copy.default", {N("x")}, f, {{"dtype", DTypeArg("f32")}});
  b.call("nl", "aten.native_layer_norm.default", {N("xf"), L({64}), with_weight ? N("w") : None, None, 1e-5},
         json::array({f, col, col}));
  b.call("mean", "getitem", {N("nl"), 1}, col);
  b.call("rstd", "getitem", {N("nl"), 2}, col);
  b.call("mr", "aten.mul.Tensor", {N("mean"), N("rstd")}, col);
  return b;
}

TEST(RuleNorm, RowStatisticsOfANativeLayerNorm) {
  const auto p = plan(row_stats_graph(false));
  const auto* m = only(p, Family::norm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->attrs.at("kind"), "layer_norm");
  EXPECT_TRUE(m->attrs.at("stats").get<bool>());
  EXPECT_EQ(m->attrs.at("outputs"), json({"mean", "rstd"}));
  EXPECT_EQ(m->epilogue, Names({"stats"}));  // its signature says so: not a norm without affine
  EXPECT_EQ(m->attrs.at("dtype_in"), "bf16");  // the kernel converts: x.float() is in the pattern
  EXPECT_EQ(m->attrs.at("dtype_out"), "f32");
  EXPECT_EQ(names(p.g, m->nodes), Names({"xf", "nl", "mean", "rstd"}));
  EXPECT_EQ(p.g.node(m->output).name, "mean");
  ASSERT_FALSE(m->operands.empty());
  EXPECT_EQ(p.g.node(m->operands[0].node).name, "x");
}

TEST(RuleNorm, RowStatisticsOfANormWithAWeightIsAMiss) {
  const auto p = plan(row_stats_graph(true));
  EXPECT_TRUE(chosen_of(p, Family::norm).empty());
}

TEST(RuleNorm, LayerNormOverTwoDimsIsAMiss) {
  GraphBuilder b;
  b.input("x", T("f32", {4, 8, 64}));
  b.call("ln", "aten.layer_norm.default", {N("x"), L({8, 64})}, T("f32", {4, 8, 64}));
  const auto p = plan(b);
  EXPECT_TRUE(p.d.chosen.empty());
  EXPECT_TRUE(has_miss(p, "norm", "only normalisation over the last dim"));
  EXPECT_EQ(names(p.g, p.d.uncovered), Names({"ln"}));
}

// Llama's RMSNorm: weight * (x.float() * rsqrt(x.float().pow(2).mean(-1, keepdim) + eps)).type_as(x);
// `form` "t5" is T5's, which squares x.float() but multiplies x itself (promoted to f32, the same
// values), then casts with .to(): the same norm. "gemma" is Gemma's, which multiplies by an f32
// weight (1 + w.float(), made from the parameter) first and casts last:
// (xf * rsqrt(...) * wf).type_as(x).
GraphBuilder rms_norm_graph(const std::string& form = "llama") {
  const bool t5 = form == "t5", gemma = form == "gemma";
  GraphBuilder b("bf16");
  const json f = T("f32", {4, 8, 64});
  b.input("x", T("bf16", {4, 8, 64}));
  b.param("w", T(gemma ? "f32" : "bf16", {64}));
  b.call("xf", t5 ? "aten.to.dtype" : "aten._to_copy.default", {N("x")}, f, {{"dtype", DTypeArg("f32")}});
  b.call("p", "aten.pow.Tensor_Scalar", {N("xf"), 2}, f);
  b.call("m", "aten.mean.dim", {N("p"), L({-1}), true}, T("f32", {4, 8, 1}));
  b.call("a", "aten.add.Tensor", {N("m"), 1e-6}, T("f32", {4, 8, 1}));
  b.call("r", "aten.rsqrt.default", {N("a")}, T("f32", {4, 8, 1}));
  b.call("y", "aten.mul.Tensor", {N(t5 ? "x" : "xf"), N("r")}, f);
  if (gemma) {
    b.call("yw", "aten.mul.Tensor", {N("y"), N("w")}, f);
    b.call("out", "aten.type_as.default", {N("yw"), N("x")}, T("bf16", {4, 8, 64}));
    return b;
  }
  if (t5) {
    b.call("yt", "aten.to.dtype", {N("y")}, T("bf16", {4, 8, 64}), {{"dtype", DTypeArg("bf16")}});
  } else {
    b.call("yt", "aten.type_as.default", {N("y"), N("x")}, T("bf16", {4, 8, 64}));
  }
  b.call("out", "aten.mul.Tensor", {N("w"), N("yt")}, T("bf16", {4, 8, 64}));
  return b;
}

TEST(RuleNorm, HandWrittenRmsNorm) {
  const auto p = plan(rms_norm_graph());
  const auto* m = only(p, Family::norm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->rule, "rms_norm_handwritten");
  EXPECT_EQ(p.g.node(m->root).name, "m");
  EXPECT_EQ(m->attrs.at("kind"), "rms_norm");
  EXPECT_DOUBLE_EQ(m->attrs.at("eps").get<double>(), 1e-6);
  EXPECT_EQ(m->attrs.at("dtype_in"), "bf16");
  EXPECT_EQ(m->attrs.at("dtype_out"), "bf16");
  EXPECT_EQ(m->epilogue, Names({"weight"}));
  EXPECT_EQ(m->problem, json({{"rows", 32}, {"cols", 64}}));
  EXPECT_EQ(names(p.g, m->nodes), Names({"xf", "p", "m", "a", "r", "y", "yt", "out"}));
  EXPECT_EQ(p.g.node(m->output).name, "out");
  ASSERT_EQ(m->operands.size(), 2u);
  EXPECT_EQ(p.g.node(m->operands[0].node).name, "x");
  EXPECT_EQ(p.g.node(m->operands[1].node).name, "w");
  EXPECT_EQ(p.d.chosen.size(), 1u);
  EXPECT_TRUE(p.d.uncovered.empty());
  expect_nothing_dropped(p);
}

// The cast after the weight joins the norm: it computes in f32 and writes bf16, without rounding
// before the weight (no round_to), and nothing is left to PyTorch.
TEST(RuleNorm, HandWrittenRmsNormCastAfterItsWeight) {
  const auto p = plan(rms_norm_graph("gemma"));
  const auto* m = only(p, Family::norm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->rule, "rms_norm_handwritten");
  EXPECT_EQ(m->epilogue, Names({"weight"}));
  EXPECT_EQ(names(p.g, m->nodes), Names({"xf", "p", "m", "a", "r", "y", "yw", "out"}));
  EXPECT_EQ(p.g.node(m->output).name, "out");
  EXPECT_EQ(m->attrs.at("dtype_in"), "bf16");
  EXPECT_EQ(m->attrs.at("dtype_out"), "bf16");
  EXPECT_FALSE(m->attrs.contains("round_to"));
  EXPECT_TRUE(p.d.uncovered.empty());
  expect_nothing_dropped(p);
}

// A cast after a weighted value that is also returned stays out: the norm ends at the weight
// and writes f32.
TEST(RuleNorm, ACastAfterTheWeightOfANormWhoseWeightedValueIsReturnedStaysOut) {
  GraphBuilder b = rms_norm_graph("gemma");
  b.outputs({"out", "yw"});
  const auto p = plan(b);
  const auto* m = only(p, Family::norm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(p.g.node(m->output).name, "yw");
  EXPECT_EQ(m->attrs.at("dtype_out"), "f32");
}

// A narrowing cast is not the same values: see HandWrittenRmsNormOfANarrowedInputIsAMiss.
TEST(RuleNorm, HandWrittenRmsNormThatMultipliesTheUncastInput) {
  const auto p = plan(rms_norm_graph("t5"));
  const auto* m = only(p, Family::norm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->rule, "rms_norm_handwritten");
  EXPECT_EQ(m->epilogue, Names({"weight"}));
  EXPECT_EQ(names(p.g, m->nodes), Names({"xf", "p", "m", "a", "r", "y", "yt", "out"}));
  EXPECT_EQ(p.g.node(m->operands[0].node).name, "x");
  EXPECT_EQ(m->attrs.at("dtype_in"), "bf16");
  EXPECT_TRUE(p.d.uncovered.empty());
  expect_nothing_dropped(p);
}

// LayerNorm written out, f32 [4, 8, 64]: u = mean(x); s = mean((x - u)^2); form "bert" writes
// x - u twice and divides by sqrt(s + eps), then weight * y + bias (BERT's TF port); "rsqrt"
// computes x - u once and multiplies by rsqrt(s + eps), without weight or bias; "var" takes
// s = x.var(-1, keepdim=True, unbiased=False) and multiplies by the weight first,
// w * (x - u) / sqrt(s + eps) + bias; "unbiased_var" the same with the sample variance.
GraphBuilder layer_norm_graph(const std::string& form = "bert") {
  GraphBuilder b;
  const json f = T("f32", {4, 8, 64});
  const json col = T("f32", {4, 8, 1});
  b.input("x", f);
  b.param("w", T("f32", {64}));
  b.param("bb", T("f32", {64}));
  b.call("u", "aten.mean.dim", {N("x"), L({-1}), true}, col);
  if (form == "var" || form == "unbiased_var") {
    b.call("s", "aten.var.dim", {N("x"), L({-1}), form == "unbiased_var", true}, col);
    b.call("d", "aten.sub.Tensor", {N("x"), N("u")}, f);
    b.call("wd", "aten.mul.Tensor", {N("w"), N("d")}, f);
    b.call("a", "aten.add.Tensor", {N("s"), 1e-5}, col);
    b.call("r", "aten.sqrt.default", {N("a")}, col);
    b.call("y", "aten.div.Tensor", {N("wd"), N("r")}, f);
    b.call("out", "aten.add.Tensor", {N("y"), N("bb")}, f);
    return b;
  }
  b.call("d", "aten.sub.Tensor", {N("x"), N("u")}, f);
  b.call("p", "aten.pow.Tensor_Scalar", {N("d"), 2}, f);
  b.call("s", "aten.mean.dim", {N("p"), L({-1}), true}, col);
  b.call("a", "aten.add.Tensor", {N("s"), 1e-12}, col);
  if (form == "bert") {
    b.call("d2", "aten.sub.Tensor", {N("x"), N("u")}, f);
    b.call("r", "aten.sqrt.default", {N("a")}, col);
    b.call("y", "aten.div.Tensor", {N("d2"), N("r")}, f);
    b.call("wy", "aten.mul.Tensor", {N("w"), N("y")}, f);
    b.call("out", "aten.add.Tensor", {N("wy"), N("bb")}, f);
  } else {
    b.call("r", "aten.rsqrt.default", {N("a")}, col);
    b.call("out", "aten.mul.Tensor", {N("d"), N("r")}, f);
  }
  return b;
}

TEST(RuleNorm, HandWrittenLayerNorm) {
  const auto p = plan(layer_norm_graph("bert"));
  const auto* m = only(p, Family::norm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->rule, "layer_norm_handwritten");
  EXPECT_EQ(m->attrs.at("kind"), "layer_norm");
  EXPECT_DOUBLE_EQ(m->attrs.at("eps").get<double>(), 1e-12);
  EXPECT_EQ(m->epilogue, Names({"weight", "bias"}));
  EXPECT_EQ(names(p.g, m->nodes), Names({"u", "d", "p", "s", "a", "d2", "r", "y", "wy", "out"}));
  ASSERT_EQ(m->operands.size(), 3u);
  EXPECT_EQ(p.g.node(m->operands[0].node).name, "x");
  EXPECT_EQ(p.g.node(m->operands[1].node).name, "w");
  EXPECT_EQ(p.g.node(m->operands[2].node).name, "bb");
  EXPECT_EQ(p.d.chosen.size(), 1u);  // not an RMS norm of x - u beside a pointwise region
  EXPECT_TRUE(p.d.uncovered.empty());

  const auto q = plan(layer_norm_graph("rsqrt"));
  const auto* plain = only(q, Family::norm);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->rule, "layer_norm_handwritten");
  EXPECT_TRUE(plain->epilogue.empty());
  EXPECT_TRUE(q.d.uncovered.empty());

  const auto v = plan(layer_norm_graph("var"));
  const auto* by_var = only(v, Family::norm);
  ASSERT_NE(by_var, nullptr);
  EXPECT_EQ(by_var->rule, "layer_norm_handwritten");
  EXPECT_EQ(by_var->epilogue, Names({"weight", "bias"}));
  EXPECT_DOUBLE_EQ(by_var->attrs.at("eps").get<double>(), 1e-5);
  EXPECT_EQ(names(v.g, by_var->nodes), Names({"u", "s", "d", "wd", "a", "r", "y", "out"}));
  EXPECT_TRUE(v.d.uncovered.empty());
}

// LayerNorm in f32 on a bf16 model, cast back after its bias: one norm writing bf16.
TEST(RuleNorm, HandWrittenLayerNormCastAfterItsBias) {
  GraphBuilder b = layer_norm_graph("bert");
  b.call("outh", "aten._to_copy.default", {N("out")}, T("bf16", {4, 8, 64}), {{"dtype", DTypeArg("bf16")}});
  const auto p = plan(b);
  const auto* m = only(p, Family::norm);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->rule, "layer_norm_handwritten");
  EXPECT_EQ(p.g.node(m->output).name, "outh");
  EXPECT_EQ(m->attrs.at("dtype_out"), "bf16");
  EXPECT_FALSE(m->attrs.contains("round_to"));
  EXPECT_TRUE(p.d.uncovered.empty());
  expect_nothing_dropped(p);
}

TEST(RuleNorm, HandWrittenNormWithTheSampleVarianceIsNoLayerNorm) {
  const auto p = plan(layer_norm_graph("unbiased_var"));
  EXPECT_TRUE(chosen_of(p, Family::norm).empty());
  EXPECT_TRUE(has_miss(p, "layer_norm_handwritten", "no variance of x"));
}

TEST(RuleNorm, HandWrittenLayerNormWhoseCentredValuesAreReadOutsideIsAMiss) {
  GraphBuilder b = layer_norm_graph("rsqrt");
  b.outputs({"out", "d"});
  const auto p = plan(b);
  EXPECT_TRUE(has_miss(p, "layer_norm_handwritten", "x - mean is used other than squared and normalised"));
  for (const auto& c : p.d.chosen) {
    if (c.match.family == Family::norm) EXPECT_NE(c.match.rule, "layer_norm_handwritten");
  }
}

TEST(RuleNorm, HandWrittenRmsNormOfANarrowedInputIsAMiss) {
  GraphBuilder b;
  const json h = T("bf16", {4, 64});
  const json r = T("bf16", {4, 1});
  b.input("x", T("f32", {4, 64}));
  b.call("xh", "aten.to.dtype", {N("x")}, h, {{"dtype", DTypeArg("bf16")}});
  b.call("p", "aten.pow.Tensor_Scalar", {N("xh"), 2}, h);
  b.call("m", "aten.mean.dim", {N("p"), L({-1}), true}, r);
  b.call("a", "aten.add.Tensor", {N("m"), 1e-6}, r);
  b.call("rs", "aten.rsqrt.default", {N("a")}, r);
  b.call("y", "aten.mul.Tensor", {N("x"), N("rs")}, T("f32", {4, 64}));
  const auto p = plan(b);
  EXPECT_TRUE(chosen_of(p, Family::norm).empty());
  EXPECT_TRUE(has_miss(p, "rms_norm_handwritten", "x is not multiplied by the reciprocal RMS"));
}

// x / sqrt(mean(x * x) + eps) in f32, no casts or weight; `flipped`: sqrt(...) / x instead.
GraphBuilder rms_by_division(bool flipped) {
  GraphBuilder b;
  const json t = T("f32", {4, 8, 64});
  const json r = T("f32", {4, 8, 1});
  b.input("x", t);
  b.call("sq", "aten.mul.Tensor", {N("x"), N("x")}, t);
  b.call("m", "aten.mean.dim", {N("sq"), L({2}), true}, r);
  b.call("a", "aten.add.Tensor", {N("m"), 1e-5}, r);
  b.call("s", "aten.sqrt.default", {N("a")}, r);
  b.call("y", "aten.div.Tensor", {N(flipped ? "s" : "x"), N(flipped ? "x" : "s")}, t);
  return b;
}

TEST(RuleNorm, HandWrittenRmsNormWithoutCastsOrWeight) {
  const auto p = plan(rms_by_division(false));
  const auto* m = only(p, Family::norm);
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->epilogue.empty());
  EXPECT_EQ(names(p.g, m->nodes), Names({"sq", "m", "a", "s", "y"}));
  EXPECT_DOUBLE_EQ(m->attrs.at("eps").get<double>(), 1e-5);
  expect_nothing_dropped(p);
}

TEST(RuleNorm, TheRmsDividedByXIsAMiss) {
  const auto p = plan(rms_by_division(true));
  EXPECT_TRUE(chosen_of(p, Family::norm).empty());
  EXPECT_TRUE(has_miss(p, "rms_norm_handwritten", "x is not divided by the RMS"));
}

TEST(RuleNorm, MeanWithoutKeepdimIsAMiss) {
  GraphBuilder b;
  b.input("x", T("f32", {4, 64}));
  b.call("p", "aten.pow.Tensor_Scalar", {N("x"), 2}, T("f32", {4, 64}));
  b.call("m", "aten.mean.dim", {N("p"), L({-1})}, T("f32", {4}));
  const auto p = plan(b);
  EXPECT_TRUE(p.d.chosen.empty());
  EXPECT_TRUE(has_miss(p, "rms_norm_handwritten", "keepdim=True"));
  EXPECT_EQ(names(p.g, p.d.uncovered), Names({"p", "m"}));
}

// Regression tests for a bug these tests found (since fixed): match_rms_norm_handwritten
// (engine/families/norm/rule_norm.cpp) put the square, the mean, the + eps and the rsqrt into the
// pattern without checking that nothing else reads them, so the fused norm swallowed a value
// the program needs.
GraphBuilder rms_norm_graph_with_extra_reader(const std::string& what) {
  GraphBuilder b;
  const json t = T("f32", {4, 64});
  const json r = T("f32", {4, 1});
  b.input("x", t);
  b.call("sq", "aten.pow.Tensor_Scalar", {N("x"), 2}, t);
  b.call("m", "aten.mean.dim", {N("sq"), L({-1}), true}, r);
  b.call("a", "aten.add.Tensor", {N("m"), 1e-5}, r);
  b.call("rs", "aten.rsqrt.default", {N("a")}, r);
  b.call("y", "aten.mul.Tensor", {N("x"), N("rs")}, t);
  if (what == "sum_of_square") {
    b.call("total", "aten.sum.default", {N("sq")}, T("f32", {}));
    b.outputs({"y", "total"});
  } else {
    b.outputs({"y", what});  // an intermediate is also returned
  }
  return b;
}

TEST(RuleNorm, HandWrittenRmsNormDoesNotSwallowASquareReadElsewhere) {
  const auto p = plan(rms_norm_graph_with_extra_reader("sum_of_square"));
  expect_no_escaping_values(p);
}

TEST(RuleNorm, HandWrittenRmsNormDoesNotSwallowASquareThatIsReturned) {
  const auto p = plan(rms_norm_graph_with_extra_reader("sq"));
  expect_no_escaping_values(p);
}

TEST(RuleNorm, HandWrittenRmsNormDoesNotSwallowAMeanThatIsReturned) {
  const auto p = plan(rms_norm_graph_with_extra_reader("m"));
  expect_no_escaping_values(p);
}

// Regression tests for a bug these tests found (since fixed): match_gated_mlp
// (engine/families/gemm/rule_gated_mlp.cpp) with activation_between (engine/discover/epilogue.cpp)
// checked the users of every activation node except the activation's output itself, so
// act(x @ W1) was fused away even when it is also returned or read by another node.
TEST(RuleGatedMlp, ActivationThatIsAlsoReturnedIsNotSwallowed) {
  auto b = gated_mlp_graph("f32", "silu");
  b.outputs({"out", "a"});
  const auto p = plan(b);
  expect_no_escaping_values(p);
}

TEST(RuleGatedMlp, HandWrittenActivationReadElsewhereIsNotSwallowed) {
  auto b = gated_mlp_graph("f32", "silu_by_hand");
  b.call("other", "aten.sum.default", {N("a")}, T("f32", {}));
  b.outputs({"out", "other"});
  const auto p = plan(b);
  expect_no_escaping_values(p);
}

// ---------------------------------------------------------------------------------------------
// A whole block from a file

TEST(RulesOnAFile, MlpBlockPlansNormGeluGemmAndResidualGemm) {
  Planned p{ir::load_graph_file(std::string(FACT_TEST_DATA) + "/mlp_block.json"), {}};
  const discover::CostModel cost(discover::hardware("sm90", ""), p.g.precision);
  p.d = discover::discover(p.g, cost);
  ASSERT_EQ(p.d.chosen.size(), 3u);
  const auto* norm = only(p, Family::norm);
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->epilogue, Names({"weight", "bias"}));
  std::vector<Names> gemm_steps;
  for (const auto* c : chosen_of(p, Family::gemm)) gemm_steps.push_back(c->match.epilogue);
  std::sort(gemm_steps.begin(), gemm_steps.end());
  EXPECT_EQ(gemm_steps, (std::vector<Names>{{"bias", "gelu_tanh"}, {"bias", "residual"}}));
  for (size_t i = 1; i < p.d.chosen.size(); ++i) {
    EXPECT_GE(p.d.chosen[i - 1].saving_s(), p.d.chosen[i].saving_s());  // best first
  }
  EXPECT_TRUE(p.d.uncovered.empty());
  EXPECT_GT(p.d.total_saving_s, 0);
  expect_nothing_dropped(p);
}

}  // namespace
}  // namespace fact::test
