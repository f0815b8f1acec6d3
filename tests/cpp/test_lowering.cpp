// Lowerings (discover/lowering.h): the checks a proposed lowering must pass before the planner
// reads it, an op of the graph taking its lowering, and the registry's proposals table.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>

#include "discover/cost_model.h"
#include "discover/lowering.h"
#include "discover/planner.h"
#include "graph_builder.h"
#include "ir/error.h"
#include "registry/registry.h"

namespace fact::test {
namespace {

json hardshrink() {
  return json::parse(R"({"op": "hardshrink", "inputs": ["self"],
    "params": [{"name": "lambd", "default": 0.5}],
    "ssa": [{"id": 0, "op": "input", "index": 0}, {"id": 1, "op": "param", "index": 0},
            {"id": 2, "op": "constant", "value": 0.0}, {"id": 3, "op": "abs", "args": [0]},
            {"id": 4, "op": "gt", "args": [3, 1]}, {"id": 5, "op": "where", "args": [4, 0, 2]}]})");
}

std::string refusal(const json& doc) {
  try {
    discover::check_lowering(doc, "proposal");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(Lowering, AWellFormedLoweringPasses) {
  const json l = discover::check_lowering(hardshrink(), "proposal");
  EXPECT_EQ(l["op"], "hardshrink");
  EXPECT_EQ(l["ssa"].size(), 6u);
  EXPECT_EQ(l["params"][0]["default"], 0.5);
}

TEST(Lowering, EveryMalformedPartIsRefusedByName) {
  auto with = [](const std::function<void(json&)>& edit) {
    json d = hardshrink();
    edit(d);
    return refusal(d);
  };
  EXPECT_NE(with([](json& d) { d["ssa"][3]["op"] = "system"; }).find("not a function of the vocabulary"),
            std::string::npos);
  // Source text where a name goes never passes: names are checked against the vocabulary.
  EXPECT_NE(with([](json& d) { d["ssa"][3]["op"] = "abs(x)); asm(\"trap\""; }).find("not a function"),
            std::string::npos);
  EXPECT_NE(with([](json& d) { d["op"] = "hard shrink; rm"; }).find("base name"), std::string::npos);
  EXPECT_NE(with([](json& d) { d["ssa"][2]["value"] = "1.0f); evil("; }).find("must be a number"),
            std::string::npos);
  EXPECT_NE(with([](json& d) { d["ssa"][4]["args"] = json::array({3, 5}); }).find("earlier entry"),
            std::string::npos);
  EXPECT_NE(with([](json& d) { d["ssa"][5]["args"] = json::array({4, 0}); }).find("takes 3"), std::string::npos);
  EXPECT_NE(with([](json& d) { d["ssa"][1]["index"] = 1; }).find("index out of range"), std::string::npos);
  EXPECT_NE(with([](json& d) { d["ssa"][1]["id"] = 7; }).find("ids count"), std::string::npos);
  EXPECT_NE(with([](json& d) { d["params"][0].erase("default"); }).find("no default"), std::string::npos);
  EXPECT_NE(with([](json& d) { d["code"] = "__global__"; }).find("unknown key"), std::string::npos);
  EXPECT_NE(with([](json& d) { d["op"] = "hardshrink_"; }).find("in-place"), std::string::npos);
  EXPECT_NE(with([](json& d) { d["ssa"][3]["op"] = std::string("ab\x1b[2Js"); }).find("'ab?[2Js'"),
            std::string::npos);  // control characters never reach a terminal
  json huge = hardshrink();
  for (int i = 0; i < 10000; ++i) huge["ssa"].push_back({{"op", "neg"}, {"args", json::array({5})}});
  EXPECT_NE(refusal(huge).find("at most 256"), std::string::npos);
}

GraphBuilder shrink_graph() {
  GraphBuilder b("bf16");
  b.input("x", T("bf16", {64, 128})).param("w", T("bf16", {256, 128}));
  b.call("y", "aten.linear.default", {N("x"), N("w")}, T("bf16", {64, 256}));
  b.call("s", "aten.hardshrink.default", {N("y"), 0.25}, T("bf16", {64, 256}));
  return b;
}

TEST(Lowering, AnOpWithALoweringJoinsTheGemmEpilogue) {
  auto g = shrink_graph().load();
  const discover::CostModel cost(discover::hardware("sm90", ""), g.precision);
  auto before = discover::discover(g, cost);
  ASSERT_EQ(before.chosen.size(), 1u);
  EXPECT_TRUE(before.chosen[0].match.epilogue.empty());
  const auto applied = discover::apply_lowerings(g, {discover::check_lowering(hardshrink(), "l")});
  EXPECT_EQ(applied, std::vector<std::string>{"hardshrink"});
  EXPECT_EQ(g.node(id_of(g, "s")).op, ir::Op::lowered);
  auto after = discover::discover(g, cost);
  ASSERT_EQ(after.chosen.size(), 1u);
  EXPECT_EQ(after.chosen[0].match.epilogue, std::vector<std::string>{"hardshrink"});
  const auto text = after.chosen[0].match.epilogue_expr.value("text", std::string());
  EXPECT_NE(text.find("0.25"), std::string::npos) << text;  // the node's lambd, not the default
}

TEST(Lowering, ANodeWhoseArgumentsDoNotFitStaysOpaque) {
  auto b = shrink_graph();
  b.call("t", "aten.hardshrink.default", {N("s"), N("y")}, T("bf16", {64, 256}));  // a tensor lambd
  b.call("u", "aten.hardshrink.out", {N("s"), 0.5}, T("bf16", {64, 256}));  // not the checked overload
  auto g = b.load();
  discover::apply_lowerings(g, {discover::check_lowering(hardshrink(), "l")});
  EXPECT_EQ(g.node(id_of(g, "s")).op, ir::Op::lowered);
  EXPECT_EQ(g.node(id_of(g, "t")).op, ir::Op::opaque);
  EXPECT_EQ(g.node(id_of(g, "u")).op, ir::Op::opaque);
}

TEST(Lowering, TheLastGivenLoweringOfAnOpWins) {
  auto g = shrink_graph().load();
  json other = hardshrink();
  other["ssa"][4]["op"] = "lt";
  discover::apply_lowerings(g, {discover::check_lowering(other, "registry"), discover::check_lowering(hardshrink(), "file")});
  EXPECT_EQ(g.lowerings.at("hardshrink")["ssa"][4]["op"], "gt");
}

TEST(Proposals, StoredListedAndSetByStatus) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "fact_prop_XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const std::string path = tmpl + "/r.db";
  {
    auto reg = registry::Registry::open_writable(path);
    const auto p = registry::proposal_from_json(
        {{"kind", "lowering"}, {"payload", hardshrink()}, {"status", "accepted"},
         {"gates", json::array({{{"gate", "numeric"}, {"passed", true}}})}, {"provenance", {{"model", "m"}}}},
        "doc");
    const int64_t id = reg.put_proposal(p);
    EXPECT_EQ(reg.put_proposal(p), id);  // the same proposal again: one row
    json bad = hardshrink();
    bad["ssa"][4]["op"] = "ge";
    const auto q = registry::proposal_from_json({{"kind", "lowering"}, {"payload", bad}, {"status", "rejected"}}, "doc");
    reg.put_proposal(q);
    EXPECT_EQ(reg.proposals("lowering", "accepted").size(), 1u);
    EXPECT_EQ(reg.proposals().size(), 2u);
    EXPECT_TRUE(reg.set_proposal_status(id, "rejected"));
    EXPECT_TRUE(reg.proposals("lowering", "accepted").empty());
    EXPECT_FALSE(reg.set_proposal_status(999, "accepted"));
    EXPECT_THROW(reg.set_proposal_status(id, "maybe"), UserError);
  }
  EXPECT_THROW(registry::proposal_from_json({{"kind", "rule"}, {"payload", hardshrink()}}, "doc"), UserError);
  json smuggled = hardshrink();
  smuggled["ssa"][3]["op"] = "abs(x);}";
  EXPECT_THROW(registry::proposal_from_json({{"kind", "lowering"}, {"payload", smuggled}, {"status", "accepted"}}, "doc"),
               UserError);
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace fact::test
