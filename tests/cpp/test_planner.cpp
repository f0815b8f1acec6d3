// Planning: overlapping candidates, the roofline cost model, hardware lookup, and `explain`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "discover/cost_model.h"
#include "discover/explain.h"
#include "discover/planner.h"
#include "graph_builder.h"
#include "ir/error.h"
#include "sample_graphs.h"

namespace fact::test {
namespace {

using discover::CostModel;
using discover::Family;
using discover::hardware;
using Names = std::vector<std::string>;

// The rejected candidate of `rule` rooted at `root`, with why it lost; nullptr if none.
const discover::Candidate* rejected(const Planned& p, const std::string& rule, const std::string& root,
                                    std::string* why = nullptr) {
  for (size_t i = 0; i < p.d.rejected.size(); ++i) {
    const auto& c = p.d.rejected[i];
    if (c.match.rule == rule && p.g.node(c.match.root).name == root) {
      if (why) *why = p.d.rejected_why[i];
      return &c;
    }
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Overlaps

TEST(Planner, GatedMlpBeatsHorizontalGemmOfTheSameTwoGemms) {
  const auto p = plan(gated_mlp_graph("bf16"));
  ASSERT_EQ(p.d.chosen.size(), 1u);
  EXPECT_EQ(p.d.chosen[0].match.family, Family::gated_mlp);
  EXPECT_EQ(p.d.rule_hits.at("horizontal_gemm"), 1);
  std::string why;
  const auto* h = rejected(p, "horizontal_gemm", "h1", &why);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(names(p.g, h->match.nodes), Names({"h1", "h3"}));
  EXPECT_EQ(why, "overlaps gated_mlp at 'out', which saves more");
  EXPECT_GT(p.d.chosen[0].saving_s(), h->saving_s());
  // Both GEMMs' own epilogue candidates lost too.
  EXPECT_NE(rejected(p, "gemm_epilogue", "h1"), nullptr);
  EXPECT_NE(rejected(p, "gemm_epilogue", "h3"), nullptr);
  expect_nothing_dropped(p);
}

TEST(Planner, AttentionBeatsTheQkGemmEpilogue) {
  const auto p = plan(attention_graph("tril"));
  ASSERT_EQ(p.d.chosen.size(), 1u);
  EXPECT_EQ(p.d.chosen[0].match.family, Family::attention);
  std::string why;
  const auto* qk = rejected(p, "gemm_epilogue", "s", &why);
  ASSERT_NE(qk, nullptr);
  EXPECT_EQ(names(p.g, qk->match.nodes), Names({"s", "sc"}));  // Q @ K^T with its scale
  EXPECT_EQ(qk->match.epilogue, Names({"scale"}));
  EXPECT_EQ(why, "overlaps attention_handwritten at 'sm', which saves more");
  EXPECT_NE(rejected(p, "gemm_epilogue", "o"), nullptr);
  EXPECT_GT(p.d.chosen[0].saving_s(), qk->saving_s());
  expect_nothing_dropped(p);
}

// Two linears whose outputs meet: `tail` "relu" is relu(a @ w1 + b1 + m @ w2 + b2), where either
// GEMM's tail can take the add and the relu; "parallel" is the parallel residual
// x + (a @ w1 + b1) + (m @ w2 + b2), where a tail taking both adds would read two full tensors.
GraphBuilder meeting_linears(const std::string& tail) {
  GraphBuilder b;
  const json t = T("bf16", {4096, 1024});
  b.input("x", t);
  b.input("a", t);
  b.input("m", T("bf16", {4096, 4096}));
  b.param("w1", T("bf16", {1024, 1024}));
  b.param("b1", T("bf16", {1024}));
  b.param("w2", T("bf16", {1024, 4096}));
  b.param("b2", T("bf16", {1024}));
  b.call("attn", "aten.linear.default", {N("a"), N("w1"), N("b1")}, t);
  b.call("mlp", "aten.linear.default", {N("m"), N("w2"), N("b2")}, t);
  if (tail == "relu") {
    b.call("add", "aten.add.Tensor", {N("attn"), N("mlp")}, t);
    b.call("out", "aten.relu.default", {N("add")}, t);
  } else {
    b.call("add", "aten.add.Tensor", {N("x"), N("attn")}, t);
    b.call("out", "aten.add.Tensor", {N("add"), N("mlp")}, t);
  }
  b.outputs({"out"});
  return b;
}

TEST(Planner, AGemmWhoseEpilogueLostKeepsWhatIsLeft) {
  const auto p = plan(meeting_linears("relu"));
  ASSERT_EQ(p.d.chosen.size(), 2u);
  EXPECT_EQ(names(p.g, p.d.chosen[0].match.nodes), Names({"mlp", "add", "out"}));
  EXPECT_EQ(p.d.chosen[0].match.epilogue, Names({"bias", "residual", "relu"}));
  EXPECT_EQ(names(p.g, p.d.chosen[1].match.nodes), Names({"attn"}));
  EXPECT_EQ(p.d.chosen[1].match.epilogue, Names({"bias"}));
  std::string why;
  const auto* lost = rejected(p, "gemm_epilogue", "attn", &why);
  ASSERT_NE(lost, nullptr);
  EXPECT_EQ(names(p.g, lost->match.nodes), Names({"attn", "add", "out"}));
  EXPECT_EQ(why, "overlaps gemm_epilogue at 'mlp', which saves more; shrunk to what it leaves: epilogue bias");
  EXPECT_TRUE(p.d.uncovered.empty());
  expect_nothing_dropped(p);
}

TEST(Planner, AnEpilogueReadsOneFullTensorSoParallelResidualsSplit) {
  const auto p = plan(meeting_linears("parallel"));
  ASSERT_EQ(p.d.chosen.size(), 2u);
  for (const auto& c : p.d.chosen) EXPECT_EQ(c.match.epilogue, Names({"bias", "residual"}));
  const auto& first = p.d.chosen[0].match;
  const auto& second = p.d.chosen[1].match;
  EXPECT_EQ(names(p.g, first.root == *p.g.find("attn") ? first.nodes : second.nodes), Names({"attn", "add"}));
  EXPECT_EQ(names(p.g, first.root == *p.g.find("mlp") ? first.nodes : second.nodes), Names({"mlp", "out"}));
  EXPECT_TRUE(has_miss(p, "gemm_epilogue",
                       "stops before 'out': it reads a second full-size tensor (the kernel reads one, as C)"));
  EXPECT_TRUE(p.d.uncovered.empty());
  expect_nothing_dropped(p);
}

TEST(Planner, TheFullTensorAnAddmmReadsCountsAsTheEpiloguesOne) {
  GraphBuilder b;
  const json t = T("bf16", {4096, 1024});
  b.input("c", t);
  b.input("r", t);
  b.input("a", t);
  b.param("w", T("bf16", {1024, 1024}));
  b.call("mm", "aten.addmm.default", {N("c"), N("a"), N("w")}, t);
  b.call("out", "aten.add.Tensor", {N("mm"), N("r")}, t);
  b.outputs({"out"});
  const auto p = plan(b);
  ASSERT_EQ(p.d.chosen.size(), 1u);
  EXPECT_EQ(names(p.g, p.d.chosen[0].match.nodes), Names({"mm"}));
  EXPECT_TRUE(has_miss(p, "gemm_epilogue",
                       "stops before 'out': it reads a second full-size tensor (the kernel reads one, as C)"));
  expect_nothing_dropped(p);
}

TEST(Planner, DisjointPatternsAreAllChosenBestFirst) {
  // Two independent linear+relu chains of different sizes.
  GraphBuilder b;
  b.input("x", T("f32", {64, 64}));
  b.input("z", T("f32", {2048, 1024}));
  b.param("w1", T("f32", {64, 64}));
  b.param("w2", T("f32", {1024, 1024}));
  b.call("small", "aten.linear.default", {N("x"), N("w1")}, T("f32", {64, 64}));
  b.call("r1", "aten.relu.default", {N("small")}, T("f32", {64, 64}));
  b.call("big", "aten.linear.default", {N("z"), N("w2")}, T("f32", {2048, 1024}));
  b.call("r2", "aten.relu.default", {N("big")}, T("f32", {2048, 1024}));
  b.outputs({"r1", "r2"});
  const auto p = plan(b);
  ASSERT_EQ(p.d.chosen.size(), 2u);
  EXPECT_EQ(p.g.node(p.d.chosen[0].match.root).name, "big");  // larger saving first
  EXPECT_EQ(p.g.node(p.d.chosen[1].match.root).name, "small");
  EXPECT_NEAR(p.d.total_saving_s, p.d.chosen[0].saving_s() + p.d.chosen[1].saving_s(), 1e-15);
  for (const auto& c : p.d.chosen) {
    EXPECT_EQ(c.unfused.launches, 2);
    EXPECT_EQ(c.fused.launches, 1);
    EXPECT_GT(c.saving_s(), 0);
  }
  expect_nothing_dropped(p);
}

TEST(Planner, WorkOnParametersAloneIsNoPattern) {
  // w2 = relu(w * g) computes a weight from parameters alone; the composed module does that
  // once (compose/hoist.py), so it is no pointwise pattern. The linear that reads it is one.
  GraphBuilder b;
  b.input("x", T("bf16", {4096, 1024}));
  b.param("w", T("bf16", {1024, 1024}));
  b.param("g", T("bf16", {1024}));
  b.call("wg", "aten.mul.Tensor", {N("w"), N("g")}, T("bf16", {1024, 1024}));
  b.call("w2", "aten.relu.default", {N("wg")}, T("bf16", {1024, 1024}));
  b.call("y", "aten.linear.default", {N("x"), N("w2")}, T("bf16", {4096, 1024}));
  b.call("r", "aten.sigmoid.default", {N("y")}, T("bf16", {4096, 1024}));
  const auto p = plan(b);
  ASSERT_EQ(p.d.chosen.size(), 1u);
  EXPECT_EQ(p.g.node(p.d.chosen[0].match.root).name, "y");
  std::string why;
  bool found = false;
  for (size_t i = 0; i < p.d.rejected.size(); ++i) {
    const auto& nodes = p.d.rejected[i].match.nodes;
    if (std::find(nodes.begin(), nodes.end(), id_of(p.g, "w2")) != nodes.end()) {
      found = true;
      why = p.d.rejected_why[i];
    }
  }
  ASSERT_TRUE(found) << "no rejected candidate covers the weight's computation";
  EXPECT_NE(why.find("parameters, buffers and constants"), std::string::npos) << why;
}

TEST(Planner, OpaqueNodesAreReportedAndLeftToPytorch) {
  GraphBuilder b;
  b.input("x", T("f32", {8, 64}));
  b.param("w", T("f32", {64, 64}));
  b.param("bias", T("f32", {64}));
  b.call("lin", "aten.linear.default", {N("x"), N("w"), N("bias")}, T("f32", {8, 64}));
  b.call("r", "aten.relu.default", {N("lin")}, T("f32", {8, 64}));
  b.call("cs", "aten.cumsum.default", {N("r"), -1}, T("f32", {8, 64}));
  const auto p = plan(b);
  ASSERT_EQ(p.d.chosen.size(), 1u);
  EXPECT_EQ(p.d.chosen[0].match.epilogue, Names({"bias", "relu"}));
  EXPECT_EQ(names(p.g, p.d.opaque), Names({"cs"}));
  EXPECT_EQ(names(p.g, p.d.uncovered), Names({"cs"}));
  expect_nothing_dropped(p);
}

// ---------------------------------------------------------------------------------------------
// Cost model

ir::Graph mm_graph(const std::string& dt, int64_t n) {
  GraphBuilder b(dt);
  b.input("a", T(dt, {n, n}));
  b.input("bm", T(dt, {n, n}));
  b.call("mm", "aten.mm.default", {N("a"), N("bm")}, T(dt, {n, n}));
  return b.load();
}

TEST(CostModel, Bf16Gemm4096OnH200IsComputeBound) {
  const auto g = mm_graph("bf16", 4096);
  const CostModel cost(hardware("sm90", "h200"), "highest");
  const auto c = cost.node(g, id_of(g, "mm"));
  const double flops = 2.0 * 4096.0 * 4096.0 * 4096.0;
  EXPECT_DOUBLE_EQ(c.flops, flops);
  EXPECT_EQ(c.launches, 1);
  EXPECT_DOUBLE_EQ(c.bytes, 3.0 * 4096 * 4096 * 2);
  const double ideal = flops / 790e12;
  EXPECT_NEAR(c.seconds, ideal, 0.1 * ideal);
  EXPECT_GE(c.seconds, ideal);
}

TEST(CostModel, Sm80IsSlowerThanSm90) {
  const auto g = mm_graph("bf16", 4096);
  const CostModel h200(hardware("sm90", ""), "highest");
  const CostModel a100(hardware("sm80", ""), "highest");
  EXPECT_GT(a100.node(g, 2).seconds, 2.0 * h200.node(g, 2).seconds);
}

TEST(CostModel, Fp32UnderHighPrecisionIsFasterThanHighest) {
  const auto g = mm_graph("f32", 4096);
  const auto& hw = hardware("sm90", "");
  const CostModel highest(hw, "highest"), high(hw, "high"), medium(hw, "medium");
  const double t_highest = highest.node(g, 2).seconds;
  const double t_high = high.node(g, 2).seconds;
  const double t_medium = medium.node(g, 2).seconds;
  EXPECT_LT(t_high, t_highest / 4);  // TF32 tensor cores vs SIMT fp32
  EXPECT_LE(t_medium, t_high);
  EXPECT_DOUBLE_EQ(highest.matmul_rate(ir::DType::f32), hw.fp32_flops);
  EXPECT_DOUBLE_EQ(high.matmul_rate(ir::DType::f32), hw.tf32_flops);
  EXPECT_DOUBLE_EQ(highest.matmul_rate(ir::DType::bf16), hw.bf16_flops);
  EXPECT_DOUBLE_EQ(highest.matmul_rate(ir::DType::f16), hw.bf16_flops);
}

TEST(CostModel, PrecisionComesFromTheGraph) {
  GraphBuilder hi("f32", "high");
  hi.input("a", T("f32", {1024, 1024}));
  hi.input("bm", T("f32", {1024, 1024}));
  hi.call("mm", "aten.mm.default", {N("a"), N("bm")}, T("f32", {1024, 1024}));
  const auto p_high = plan(hi);
  EXPECT_EQ(p_high.g.precision, "high");
  GraphBuilder lo("f32", "highest");
  lo.input("a", T("f32", {1024, 1024}));
  lo.input("bm", T("f32", {1024, 1024}));
  lo.call("mm", "aten.mm.default", {N("a"), N("bm")}, T("f32", {1024, 1024}));
  const auto p_highest = plan(lo);
  EXPECT_LT(p_high.d.total_unfused.seconds, p_highest.d.total_unfused.seconds);
}

TEST(CostModel, ViewsAndPlaceholdersCostNothing) {
  GraphBuilder b;
  b.input("x", T("f32", {64, 32}));
  b.call("v", "aten.view.default", {N("x"), L({32, 64})}, T("f32", {32, 64}));
  b.call("r", "aten.relu.default", {N("v")}, T("f32", {32, 64}));
  const auto g = b.load();
  const CostModel cost(hardware("sm90", ""), "highest");
  for (const char* name : {"x", "v"}) {
    const auto c = cost.node(g, id_of(g, name));
    EXPECT_EQ(c.launches, 0) << name;
    EXPECT_EQ(c.seconds, 0) << name;
  }
  const auto r = cost.node(g, id_of(g, "r"));
  EXPECT_EQ(r.launches, 1);
  EXPECT_DOUBLE_EQ(r.bytes, 2.0 * 64 * 32 * 4);
  EXPECT_GE(r.seconds, hardware("sm90", "").launch_s);
}

TEST(CostModel, FusedGemmEpilogueSavesALaunchAndTheRoundTrip) {
  const auto p = plan(gated_mlp_graph("f32", "silu"));
  const auto& c = p.d.chosen.at(0);
  EXPECT_EQ(c.unfused.launches, 4);  // h1, silu, h3, mul
  EXPECT_EQ(c.fused.launches, 1);
  EXPECT_LT(c.fused.bytes, c.unfused.bytes);
  EXPECT_DOUBLE_EQ(c.fused.flops, 2.0 * 2.0 * 16 * 96 * 64);
}

// ---------------------------------------------------------------------------------------------
// Hardware lookup

TEST(Hardware, ArchDefaultsAndGpuNames) {
  EXPECT_EQ(hardware("sm90", "").gpu, "h200");
  EXPECT_EQ(hardware("sm80", "").gpu, "a100");
  EXPECT_EQ(hardware("", "h100").arch, "sm90");
  EXPECT_EQ(hardware("sm90", "h100").gpu, "h100");
  EXPECT_EQ(discover::known_gpus(), Names({"h200", "h100", "a100"}));
  EXPECT_LT(hardware("", "h100").bandwidth, hardware("", "h200").bandwidth);
}

std::string hardware_error(const std::string& arch, const std::string& gpu) {
  try {
    hardware(arch, gpu);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(Hardware, UnknownArchIsAUserError) {
  const auto msg = hardware_error("sm70", "");
  EXPECT_NE(msg.find("unknown --arch 'sm70'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("sm90"), std::string::npos) << msg;
}

TEST(Hardware, UnknownGpuIsAUserError) {
  const auto msg = hardware_error("sm90", "v100");
  EXPECT_NE(msg.find("unknown --gpu 'v100'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("h200"), std::string::npos) << msg;
}

TEST(Hardware, GpuOfAnotherArchIsAUserError) {
  const auto msg = hardware_error("sm80", "h200");
  EXPECT_NE(msg.find("h200 is an sm90 part, not sm80"), std::string::npos) << msg;
}

TEST(Hardware, NothingGivenIsAUserError) { EXPECT_THROW(hardware("", ""), UserError); }

// ---------------------------------------------------------------------------------------------
// explain

Planned opaque_tail_plan() {
  GraphBuilder b;
  b.input("x", T("f32", {8, 64}));
  b.param("w", T("f32", {64, 64}));
  b.param("bias", T("f32", {64}));
  b.call("lin", "aten.linear.default", {N("x"), N("w"), N("bias")}, T("f32", {8, 64}));
  b.call("r", "aten.relu.default", {N("lin")}, T("f32", {8, 64}));
  b.call("rope", "mylib.rope.default", {N("r")}, T("f32", {8, 64}));
  return plan(b);
}

TEST(Explain, CoveredNodeNamesItsPattern) {
  const auto p = opaque_tail_plan();
  const auto e = discover::explain(p.g, p.d, id_of(p.g, "r"));
  EXPECT_EQ(e.at("node").at("name"), "r");
  EXPECT_EQ(e.at("node").at("class"), "pointwise");
  ASSERT_FALSE(e.at("covered_by").is_null());
  EXPECT_EQ(e.at("covered_by").at("rule"), "gemm_epilogue");
  EXPECT_EQ(e.at("covered_by").at("family"), "gemm");
  EXPECT_EQ(e.at("covered_by").at("root"), "lin");
  EXPECT_EQ(e.at("covered_by").at("epilogue"), json::array({"bias", "relu"}));
  EXPECT_EQ(e.at("covered_by").at("plan_index"), 1);
  EXPECT_EQ(e.at("note"), "");
}

TEST(Explain, OpaqueNodeSaysItIsOpaque) {
  const auto p = opaque_tail_plan();
  const auto e = discover::explain(p.g, p.d, id_of(p.g, "rope"));
  EXPECT_TRUE(e.at("covered_by").is_null());
  EXPECT_EQ(e.at("node").at("class"), "opaque");
  const auto note = e.at("note").get<std::string>();
  EXPECT_NE(note.find("opaque"), std::string::npos) << note;
  EXPECT_NE(note.find("mylib.rope.default"), std::string::npos) << note;
  EXPECT_TRUE(e.at("rules_rooted_here").empty());
}

TEST(Explain, PlaceholderIsData) {
  const auto p = opaque_tail_plan();
  const auto e = discover::explain(p.g, p.d, id_of(p.g, "w"));
  EXPECT_TRUE(e.at("covered_by").is_null());
  EXPECT_NE(e.at("note").get<std::string>().find("parameter"), std::string::npos);
}

TEST(Explain, GemmLosingToAttentionListsTheWinnerAndTheRulesRootedThere) {
  const auto p = plan(attention_graph("tril"));
  const auto e = discover::explain(p.g, p.d, id_of(p.g, "s"));
  EXPECT_EQ(e.at("covered_by").at("rule"), "attention_handwritten");
  bool lost_gemm = false;
  for (const auto& l : e.at("lost_candidates")) {
    lost_gemm = lost_gemm || (l.at("rule") == "gemm_epilogue" && l.at("root") == "s" &&
                              l.at("why").get<std::string>().find("attention_handwritten") != std::string::npos);
  }
  EXPECT_TRUE(lost_gemm) << e.dump(2);
  const auto rooted = e.at("rules_rooted_here").get<Names>();
  EXPECT_EQ(rooted, Names({"gemm_epilogue", "horizontal_gemm"}));
}

TEST(Explain, UncoveredSoftmaxReportsTheNearestMiss) {
  const auto p = plan(attention_graph("tril", 1));
  const auto e = discover::explain(p.g, p.d, id_of(p.g, "sm"));
  EXPECT_TRUE(e.at("covered_by").is_null());
  ASSERT_FALSE(e.at("misses").empty()) << e.dump(2);
  EXPECT_EQ(e.at("misses")[0].at("rule"), "attention_handwritten");
  EXPECT_EQ(e.at("misses")[0].at("hops"), 0);
  EXPECT_NE(e.at("misses")[0].at("reason").get<std::string>().find("not over the last dim"), std::string::npos);
  EXPECT_NE(e.at("note").get<std::string>().find("runs as the original PyTorch op"), std::string::npos);
}

TEST(Explain, UncoveredViewCostsNothing) {
  const auto p = plan(attention_graph("tril", 1));
  const auto e = discover::explain(p.g, p.d, id_of(p.g, "kt"));
  EXPECT_TRUE(e.at("covered_by").is_null());
  EXPECT_NE(e.at("note").get<std::string>().find("launches no kernel"), std::string::npos);
}

}  // namespace
}  // namespace fact::test
