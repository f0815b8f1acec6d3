// The graph IR: loading a traced graph, derived structure, and every way a bad file is refused.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <string>

#include "graph_builder.h"
#include "ir/error.h"
#include "ir/graph.h"
#include "ir/json_io.h"
#include "ir/ops.h"
#include "ir/print.h"

namespace fact::test {
namespace {

using ir::Op;

// x -> linear(+bias) -> leaky_relu(kwarg slope) -> mylib.rope (opaque); an assert reads x.
GraphBuilder small_graph() {
  GraphBuilder b;
  b.input("x", T("f32", {4, 8}));
  b.param("w", T("f32", {16, 8}));
  b.param("b", T("f32", {16}));
  b.call("check", "aten._assert_tensor_metadata.default", {N("x")}, None, {{"dtype", DTypeArg("f32")}});
  b.call("linear", "aten.linear.default", {N("x"), N("w"), N("b")}, T("f32", {4, 16}), json::object(), "fc");
  b.call("act", "aten.leaky_relu.default", {N("linear")}, T("f32", {4, 16}), {{"negative_slope", 0.2}});
  b.call("rope", "mylib.rope.default", {N("act"), 3}, T("f32", {4, 16}));
  return b;
}

// Load `text` and return the UserError's message ("" if it loaded).
std::string load_error(const std::string& text) {
  try {
    ir::load_graph_string(text, "bad.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// A valid document with one node edited by `edit`.
std::string with_node(const std::string& name, const std::function<void(json&)>& edit) {
  json d = small_graph().doc();
  for (auto& n : d["nodes"]) {
    if (n["name"] == name) edit(n);
  }
  return d.dump();
}

// ---------------------------------------------------------------------------------------------
// A valid graph

TEST(IrLoad, ValidGraphKeepsNodesInOrderWithMetadata) {
  const auto g = small_graph().load();
  ASSERT_EQ(g.size(), 7);
  EXPECT_EQ(g.version, 1);
  EXPECT_EQ(g.dtype, "f32");
  EXPECT_EQ(g.precision, "highest");
  EXPECT_EQ(g.torch_version, "2.15.0");
  for (int i = 0; i < g.size(); ++i) EXPECT_EQ(g.node(i).id, i);
  EXPECT_EQ(g.node(0).kind, ir::NodeKind::input);
  EXPECT_EQ(g.node(1).kind, ir::NodeKind::parameter);
  const auto& lin = g.node(id_of(g, "linear"));
  EXPECT_EQ(lin.op, Op::linear);
  EXPECT_EQ(lin.module, "fc");
  EXPECT_EQ(lin.type().str(), "f32[4, 16]");
  ASSERT_EQ(lin.args.size(), 3u);
  EXPECT_EQ(lin.args[1].kind, ir::Arg::Kind::node);
  EXPECT_EQ(lin.args[1].node, id_of(g, "w"));
  ASSERT_EQ(g.outputs.size(), 1u);
  EXPECT_TRUE(g.is_graph_output(id_of(g, "rope")));
  EXPECT_FALSE(g.is_graph_output(id_of(g, "act")));
}

TEST(IrLoad, UsersAreDerivedAndAssertsAreNotUsers) {
  const auto g = small_graph().load();
  // x is read by the assert and by linear; the assert never counts as a user.
  EXPECT_EQ(g.node(id_of(g, "x")).users, std::vector<int>{id_of(g, "linear")});
  EXPECT_EQ(g.node(id_of(g, "linear")).users, std::vector<int>{id_of(g, "act")});
  EXPECT_EQ(g.node(id_of(g, "act")).users, std::vector<int>{id_of(g, "rope")});
  EXPECT_TRUE(g.node(id_of(g, "rope")).users.empty());
  EXPECT_EQ(g.operands(g.node(id_of(g, "linear"))),
            (std::vector<int>{id_of(g, "x"), id_of(g, "w"), id_of(g, "b")}));
}

TEST(IrLoad, NodeReadingTheSameTensorTwiceHasOneUserEntry) {
  GraphBuilder b;
  b.input("x", T("f32", {4}));
  b.call("sq", "aten.mul.Tensor", {N("x"), N("x")}, T("f32", {4}));
  const auto g = b.load();
  EXPECT_EQ(g.node(0).users, std::vector<int>{1});
  EXPECT_EQ(g.operands(g.node(1)), (std::vector<int>{0, 0}));
}

TEST(IrLoad, FinalizeRecomputesUsersAndNameIndex) {
  auto g = small_graph().load();
  const auto users_before = g.node(id_of(g, "linear")).users;
  // A test (or a pass) appends a node by hand: finalize derives its id, name and users.
  ir::Node extra;
  extra.name = "extra";
  extra.target_op = "aten.relu.default";
  extra.op = Op::relu;
  ir::Arg a;
  a.kind = ir::Arg::Kind::node;
  a.node = id_of(g, "linear");
  extra.args.push_back(a);
  extra.outputs.push_back(g.node(id_of(g, "linear")).type());
  g.nodes.push_back(extra);
  for (auto& n : g.nodes) n.users.clear();
  g.by_name.clear();
  g.finalize();
  ASSERT_TRUE(g.find("extra").has_value());
  EXPECT_EQ(*g.find("extra"), 7);
  EXPECT_EQ(g.node(7).id, 7);
  auto want = users_before;
  want.push_back(7);
  EXPECT_EQ(g.node(id_of(g, "linear")).users, want);
  EXPECT_EQ(g.node(id_of(g, "x")).users, std::vector<int>{id_of(g, "linear")});
  EXPECT_FALSE(g.find("nope").has_value());
}

TEST(IrLoad, ArgLookupIsPositionalThenKeyword) {
  const auto g = small_graph().load();
  const auto& act = g.node(id_of(g, "act"));
  ASSERT_NE(act.arg(0, "self"), nullptr);
  EXPECT_TRUE(act.arg(0, "self")->is_node());
  EXPECT_EQ(act.arg(0, "self")->node, id_of(g, "linear"));
  // negative_slope was passed by keyword: found at position 1 only through its name.
  const ir::Arg* slope = act.arg(1, "negative_slope");
  ASSERT_NE(slope, nullptr);
  EXPECT_EQ(slope->kind, ir::Arg::Kind::real);
  EXPECT_DOUBLE_EQ(slope->number(), 0.2);
  EXPECT_EQ(act.arg(-1, "negative_slope"), slope);  // keyword only
  EXPECT_EQ(act.arg(1), nullptr);                   // no such positional, no name given
  EXPECT_EQ(act.arg(-1, "inplace"), nullptr);
  // rope's second argument is positional: the name is not consulted.
  const auto& rope = g.node(id_of(g, "rope"));
  ASSERT_NE(rope.arg(1, "anything"), nullptr);
  EXPECT_EQ(rope.arg(1, "anything")->kind, ir::Arg::Kind::integer);
  EXPECT_EQ(rope.arg(1, "anything")->i, 3);
}

TEST(IrLoad, ArgumentValueSpellings) {
  GraphBuilder b;
  b.input("x", T("f32", {2, 3}));
  b.call("y", "mylib.op.default", {N("x"), Float("-inf"), Float("inf"), DTypeArg("bf16"), json{{"symbol", "s0"}},
                                    json{{"repr", "<obj>"}}, L({1, 2}), 1.0, true, "mean", None},
         T("f32", {2, 3}));
  const auto g = b.load();
  const auto& a = g.node(1).args;
  ASSERT_EQ(a.size(), 11u);
  EXPECT_EQ(a[1].kind, ir::Arg::Kind::real);
  EXPECT_TRUE(std::isinf(a[1].f) && a[1].f < 0);
  EXPECT_TRUE(std::isinf(a[2].f) && a[2].f > 0);
  EXPECT_EQ(a[3].kind, ir::Arg::Kind::enum_value);
  EXPECT_EQ(a[3].tag, "dtype");
  EXPECT_EQ(a[3].s, "bf16");
  EXPECT_EQ(a[4].kind, ir::Arg::Kind::symbol);
  EXPECT_EQ(a[5].kind, ir::Arg::Kind::other);
  EXPECT_EQ(a[6].kind, ir::Arg::Kind::list);
  ASSERT_EQ(a[6].items.size(), 2u);
  EXPECT_EQ(a[6].items[1].i, 2);
  EXPECT_EQ(a[7].kind, ir::Arg::Kind::real);  // 1.0 keeps being a float
  EXPECT_EQ(a[8].kind, ir::Arg::Kind::boolean);
  EXPECT_EQ(a[9].kind, ir::Arg::Kind::string);
  EXPECT_EQ(a[10].kind, ir::Arg::Kind::none);
}

TEST(IrLoad, UnknownOpsAreKeptAsOpaqueNodes) {
  const auto g = small_graph().load();
  const auto& rope = g.node(id_of(g, "rope"));
  EXPECT_EQ(rope.op, Op::opaque);
  EXPECT_EQ(rope.target_op, "mylib.rope.default");
  EXPECT_EQ(rope.kind, ir::NodeKind::call);
  EXPECT_EQ(ir::op_class(rope.op), ir::OpClass::opaque);
}

TEST(IrTypes, IsContiguous) {
  ir::TensorType t;
  t.shape = {2, 3, 4};
  t.strides = {12, 4, 1};
  EXPECT_TRUE(t.is_contiguous());
  t.strides = {12, 1, 3};  // last two dims transposed
  EXPECT_FALSE(t.is_contiguous());
  t.shape = {3, 4};
  t.strides = {1, 3};  // a transposed matrix
  EXPECT_FALSE(t.is_contiguous());
  t.shape = {1, 4};
  t.strides = {99, 1};  // size-1 dims may have any stride
  EXPECT_TRUE(t.is_contiguous());
  t.shape = {4, 8};
  t.strides = {16, 1};  // a row slice of a wider matrix
  EXPECT_FALSE(t.is_contiguous());
  t.shape = {};
  t.strides = {};
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.numel(), 1);
}

TEST(IrTypes, DtypeTable) {
  EXPECT_EQ(ir::dtype_from_name("bf16"), ir::DType::bf16);
  EXPECT_EQ(ir::dtype_from_name("bool"), ir::DType::boolean);
  EXPECT_FALSE(ir::dtype_from_name("other").has_value());
  EXPECT_FALSE(ir::dtype_from_name("float4_e2m1").has_value());
  EXPECT_EQ(ir::dtype_bytes(ir::DType::bf16), 2);
  EXPECT_EQ(ir::dtype_bytes(ir::DType::f32), 4);
  EXPECT_TRUE(ir::is_floating(ir::DType::f8e4m3));
  EXPECT_FALSE(ir::is_floating(ir::DType::i64));
}

TEST(IrTypes, UnknownDtypeIsKeptAsSpelt) {
  GraphBuilder b;
  b.input("x", T("float4_e2m1fn_x2", {2, 3}));
  const auto g = b.outputs({"x"}).load();
  EXPECT_EQ(g.node(0).type().dtype, ir::DType::other);
  EXPECT_EQ(g.node(0).type().str(), "float4_e2m1fn_x2[2, 3]");
}

TEST(IrOps, OpFromTargetMapping) {
  EXPECT_EQ(ir::op_from_target("aten.add.Tensor"), Op::add);
  EXPECT_EQ(ir::op_from_target("aten.linear.default"), Op::linear);
  EXPECT_EQ(ir::op_from_target("aten._to_copy.default"), Op::to_dtype);
  EXPECT_EQ(ir::op_from_target("aten._softmax.default"), Op::softmax);
  EXPECT_EQ(ir::op_from_target("aten.relu_.default"), Op::relu);
  EXPECT_EQ(ir::op_from_target("aten.numpy_T.default"), Op::numpy_T);
  EXPECT_EQ(ir::op_from_target("aten.mT.default"), Op::mT);
  EXPECT_EQ(ir::op_from_target("aten.expand_as.default"), Op::expand_as);
  EXPECT_EQ(ir::op_from_target("aten.scaled_dot_product_attention.default"), Op::sdpa);
  EXPECT_EQ(ir::op_from_target("aten._assert_tensor_metadata.default"), Op::assert_metadata);
  EXPECT_EQ(ir::op_from_target("placeholder"), Op::placeholder);
  EXPECT_EQ(ir::op_from_target("getitem"), Op::getitem);
  // Unknown: other namespaces, Python callables, unknown ATen ops, and the internal names.
  EXPECT_EQ(ir::op_from_target("aten.cumsum.default"), Op::opaque);
  EXPECT_EQ(ir::op_from_target("mylib.add.Tensor"), Op::opaque);
  EXPECT_EQ(ir::op_from_target("python.operator.mul"), Op::opaque);
  EXPECT_EQ(ir::op_from_target("higher_order.cond"), Op::opaque);
  EXPECT_EQ(ir::op_from_target("aten.placeholder.default"), Op::opaque);
  EXPECT_EQ(ir::op_from_target("aten.getitem.default"), Op::opaque);
  EXPECT_EQ(ir::op_from_target("add"), Op::opaque);
  EXPECT_EQ(ir::op_name(Op::sdpa), "scaled_dot_product_attention");
  EXPECT_EQ(ir::op_class(Op::linear), ir::OpClass::gemm);
  EXPECT_EQ(ir::op_class(Op::to_dtype), ir::OpClass::cast);
}

TEST(IrOps, InPlaceFormsOfPointwiseOps) {
  EXPECT_EQ(ir::op_from_target("aten.add_.Tensor"), Op::add);
  EXPECT_EQ(ir::op_from_target("aten.hardtanh_.default"), Op::hardtanh);
  EXPECT_EQ(ir::op_from_target("aten.masked_fill_.Scalar"), Op::masked_fill);
  EXPECT_EQ(ir::op_from_target("aten.clip_.default"), Op::clamp);  // an alias's in-place form
  EXPECT_TRUE(ir::in_place_target("aten.mul_.Tensor"));
  EXPECT_FALSE(ir::in_place_target("aten.mul.Tensor"));
  EXPECT_FALSE(ir::in_place_target("aten._softmax.default"));
  // Only pointwise ops: an in-place copy, index or view change stays opaque.
  EXPECT_EQ(ir::op_from_target("aten.copy_.default"), Op::opaque);
  EXPECT_EQ(ir::op_from_target("aten.index_put_.default"), Op::opaque);
  EXPECT_EQ(ir::op_from_target("aten.unsqueeze_.default"), Op::opaque);
  EXPECT_EQ(ir::op_from_target("aten.add__.Tensor"), Op::opaque);
}

namespace {
// x -> linear -> y; then `write` (an in-place op on `base`) and whatever `more` adds.
GraphBuilder linear_then(const std::function<void(GraphBuilder&)>& more) {
  GraphBuilder b;
  b.input("x", T("f32", {4, 8})).param("w", T("f32", {16, 8}));
  b.call("y", "aten.linear.default", {N("x"), N("w")}, T("f32", {4, 16}));
  more(b);
  return b;
}
Op op_of(const ir::Graph& g, const std::string& name) { return g.node(id_of(g, name)).op; }
}  // namespace

TEST(IrOps, InPlaceWriteNobodySeesReadsAsTheFunctionalOp) {
  const auto g = linear_then([](GraphBuilder& b) {
                   b.call("y2", "aten.add_.Tensor", {N("y"), 1.0}, T("f32", {4, 16}));
                   b.call("y3", "aten.hardtanh_.default", {N("y2"), -2.0, 2.0}, T("f32", {4, 16}));
                   b.call("y4", "aten.mul_.Tensor", {N("y3"), 0.5}, T("f32", {4, 16}));
                 }).load();
  EXPECT_EQ(op_of(g, "y2"), Op::add);
  EXPECT_EQ(op_of(g, "y3"), Op::hardtanh);
  EXPECT_EQ(op_of(g, "y4"), Op::mul);
}

TEST(IrOps, InPlaceWriteSomeoneCanSeeStaysOpaque) {
  // The write lands in the caller's tensor.
  auto g = linear_then([](GraphBuilder& b) {
             b.call("x2", "aten.mul_.Tensor", {N("x"), 2.0}, T("f32", {4, 8}));
           }).outputs({"y", "x2"}).load();
  EXPECT_EQ(op_of(g, "x2"), Op::opaque);
  // Through a view, into the base.
  g = linear_then([](GraphBuilder& b) {
        b.call("v", "aten.slice.Tensor", {N("y"), 1, 0, 8}, T("f32", {4, 8}, std::vector<int64_t>{16, 1}));
        b.call("v2", "aten.mul_.Tensor", {N("v"), 2.0}, T("f32", {4, 8}, std::vector<int64_t>{16, 1}));
      }).outputs({"y", "v2"}).load();
  EXPECT_EQ(op_of(g, "v2"), Op::opaque);
  // The old name is read after the write (it sees the written values).
  g = linear_then([](GraphBuilder& b) {
        b.call("y2", "aten.mul_.Tensor", {N("y"), 2.0}, T("f32", {4, 16}));
        b.call("z", "aten.add.Tensor", {N("y"), N("y2")}, T("f32", {4, 16}));
      }).load();
  EXPECT_EQ(op_of(g, "y2"), Op::opaque);
  // The old name is a graph output.
  g = linear_then([](GraphBuilder& b) {
        b.call("y2", "aten.mul_.Tensor", {N("y"), 2.0}, T("f32", {4, 16}));
      }).outputs({"y"}).load();
  EXPECT_EQ(op_of(g, "y2"), Op::opaque);
  // An alias taken before the write and read after it.
  g = linear_then([](GraphBuilder& b) {
        b.call("a", "aten.view.default", {N("y"), L({64})}, T("f32", {64}));
        b.call("y2", "aten.mul_.Tensor", {N("y"), 2.0}, T("f32", {4, 16}));
        b.call("z", "aten.sum.default", {N("a")}, T("f32", {}));
      }).outputs({"y2", "z"}).load();
  EXPECT_EQ(op_of(g, "y2"), Op::opaque);
  // A chain breaks where one link is seen: the next link writes into an opaque op's output.
  g = linear_then([](GraphBuilder& b) {
        b.call("y2", "aten.mul_.Tensor", {N("y"), 2.0}, T("f32", {4, 16}));
        b.call("y3", "aten.relu_.default", {N("y2")}, T("f32", {4, 16}));
      }).outputs({"y", "y3"}).load();
  EXPECT_EQ(op_of(g, "y2"), Op::opaque);
  EXPECT_EQ(op_of(g, "y3"), Op::opaque);
  // An op the catalog does not know may return an alias (diagonal, unfold, as_strided).
  g = linear_then([](GraphBuilder& b) {
        b.call("d", "aten.diagonal.default", {N("y")}, T("f32", {4}, std::vector<int64_t>{17}));
        b.call("y2", "aten.mul_.Tensor", {N("y"), 2.0}, T("f32", {4, 16}));
      }).outputs({"d", "y2"}).load();
  EXPECT_EQ(op_of(g, "y2"), Op::opaque);
  // A read before the write is fine.
  g = linear_then([](GraphBuilder& b) {
        b.call("z", "aten.mul.Tensor", {N("y"), 3.0}, T("f32", {4, 16}));
        b.call("y2", "aten.mul_.Tensor", {N("y"), 2.0}, T("f32", {4, 16}));
      }).outputs({"z", "y2"}).load();
  EXPECT_EQ(op_of(g, "y2"), Op::mul);
}

TEST(IrPrint, ListsEveryNodeOnItsOwnLine) {
  const auto g = small_graph().load();
  std::ostringstream os;
  ir::print_graph(g, os);
  const auto text = os.str();
  EXPECT_NE(text.find("# fact.graph v1 from test (f32, fp32 matmul precision highest)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("%x = input x : f32[4, 8]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("%w = parameter w : f32[16, 8]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("%linear = aten.linear.default(%x, %w, %b) : f32[4, 16]  # fc\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("%act = aten.leaky_relu.default(%linear, negative_slope=0.2) : f32[4, 16]\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("%rope = mylib.rope.default(%act, 3) : f32[4, 16]  [opaque]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("return %rope\n"), std::string::npos) << text;
  // One line per node, plus the header and the return line.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), g.size() + 2);
}

TEST(IrLoad, LoadsFromAFile) {
  const auto path = std::filesystem::temp_directory_path() / ("fact_test_graph_" + std::to_string(::getpid()) + ".json");
  {
    std::ofstream out(path);
    out << small_graph().str();
  }
  const auto g = ir::load_graph_file(path.string());
  std::filesystem::remove(path);
  EXPECT_EQ(g.size(), 7);
}

TEST(IrLoad, LoadsTheCheckedInSampleGraph) {
  const auto g = ir::load_graph_file(std::string(FACT_TEST_DATA) + "/mlp_block.json");
  EXPECT_EQ(g.model, "MlpBlock");
  ASSERT_TRUE(g.find("gelu").has_value());
  EXPECT_EQ(g.node(*g.find("gelu")).op, Op::gelu);
}

TEST(IrLoad, ValueFactsAreRead) {
  GraphBuilder b;
  b.input("x", T("f32", {4}));
  b.constant("c", T("f32", {}), {{"value", 0.5}});
  b.buffer("mask", T("bool", {4, 4}), {{"tril", true}, {"causal_additive", false}});
  b.call("o", "aten.add.Tensor", {N("x"), N("c")}, T("f32", {4}));
  const auto g = b.load();
  EXPECT_EQ(g.node(id_of(g, "c")).facts.at("value"), 0.5);
  EXPECT_TRUE(g.node(id_of(g, "mask")).has_fact("tril"));
  EXPECT_EQ(g.node(id_of(g, "mask")).facts.at("tril"), 1.0);
  EXPECT_EQ(g.node(id_of(g, "mask")).facts.at("causal_additive"), 0.0);
  EXPECT_FALSE(g.node(id_of(g, "x")).has_fact("value"));
}

// Regression test for a bug these tests found (since fixed): docs/graph-format.md says a "value"
// fact is an argument value, {"float": "-inf"} for -inf, and python/fact/tracer.py writes it
// that way (facts["value"] = _value(t.item())). The loader (engine/ir/json_io.cpp, parse_node,
// the "facts" loop) kept only booleans and numbers and silently dropped the object, so a lifted
// -inf / inf / nan constant had no value fact.
TEST(IrLoad, NonFiniteValueFactIsRead) {
  GraphBuilder b;
  b.input("x", T("f32", {4}));
  b.constant("ninf", T("f32", {}), {{"value", Float("-inf")}});
  b.call("o", "aten.add.Tensor", {N("x"), N("ninf")}, T("f32", {4}));
  const auto g = b.load();
  const auto& facts = g.node(id_of(g, "ninf")).facts;
  ASSERT_EQ(facts.count("value"), 1u);
  EXPECT_TRUE(std::isinf(facts.at("value")) && facts.at("value") < 0);
}

// ---------------------------------------------------------------------------------------------
// Bad input: a UserError that names the problem (and the node, where there is one)

TEST(IrLoadErrors, MissingFile) {
  try {
    ir::load_graph_file("/nonexistent/dir/graph.json");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/graph.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos) << e.what();
  }
}

TEST(IrLoadErrors, MalformedJson) {
  const auto msg = load_error("{ \"format\": \"fact.graph\", nodes: ");
  EXPECT_NE(msg.find("bad.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("malformed JSON"), std::string::npos) << msg;
}

TEST(IrLoadErrors, TruncatedJson) {
  const auto text = small_graph().str();
  const auto msg = load_error(text.substr(0, text.size() / 2));
  EXPECT_NE(msg.find("malformed JSON"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(IrLoadErrors, EmptyText) {
  EXPECT_NE(load_error("").find("malformed JSON"), std::string::npos);
}

TEST(IrLoadErrors, NotAnObject) {
  EXPECT_NE(load_error("[1, 2]").find("a FACT graph is a JSON object"), std::string::npos);
}

TEST(IrLoadErrors, WrongFormat) {
  json d = small_graph().doc();
  d["format"] = "onnx";
  const auto msg = load_error(d.dump());
  EXPECT_NE(msg.find("not a FACT graph"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"format\" must be \"fact.graph\""), std::string::npos) << msg;
}

TEST(IrLoadErrors, UnsupportedVersionIsNamed) {
  json d = small_graph().doc();
  d["version"] = 2;
  const auto msg = load_error(d.dump());
  EXPECT_NE(msg.find("version 2 is not supported"), std::string::npos) << msg;
  EXPECT_NE(msg.find("reads version 1"), std::string::npos) << msg;
}

TEST(IrLoadErrors, MissingVersion) {
  json d = small_graph().doc();
  d.erase("version");
  EXPECT_NE(load_error(d.dump()).find("no integer \"version\""), std::string::npos);
}

TEST(IrLoadErrors, ReferenceToALaterNode) {
  // act reads rope, which comes after it.
  const auto msg = load_error(with_node("act", [](json& n) { n["args"][0] = N("rope"); }));
  EXPECT_NE(msg.find("node 'act'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("refers to node 'rope'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not defined before it"), std::string::npos) << msg;
}

TEST(IrLoadErrors, ReferenceToAnUnknownNode) {
  const auto msg = load_error(with_node("linear", [](json& n) { n["args"][1] = N("weight_typo"); }));
  EXPECT_NE(msg.find("node 'linear'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'weight_typo'"), std::string::npos) << msg;
}

TEST(IrLoadErrors, ReferenceInsideAListOrKwargIsChecked) {
  auto msg = load_error(with_node("rope", [](json& n) { n["args"][1] = json::array({N("ghost")}); }));
  EXPECT_NE(msg.find("node 'rope'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'ghost'"), std::string::npos) << msg;
  msg = load_error(with_node("act", [](json& n) { n["kwargs"]["negative_slope"] = N("ghost"); }));
  EXPECT_NE(msg.find("node 'act'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'ghost'"), std::string::npos) << msg;
}

TEST(IrLoadErrors, OutputIndexOutOfRange) {
  const auto msg = load_error(with_node("act", [](json& n) { n["args"][0] = {{"node", "linear"}, {"output", 1}}; }));
  EXPECT_NE(msg.find("node 'act'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("output 1 of node 'linear'"), std::string::npos) << msg;
}

TEST(IrLoadErrors, GraphOutputReferencesUnknownNode) {
  json d = small_graph().doc();
  d["outputs"] = json::array({N("ghost")});
  const auto msg = load_error(d.dump());
  EXPECT_NE(msg.find("graph outputs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'ghost'"), std::string::npos) << msg;
}

TEST(IrLoadErrors, DuplicateNames) {
  json d = small_graph().doc();
  d["nodes"][5]["name"] = "linear";  // act renamed to an existing name
  const auto msg = load_error(d.dump());
  EXPECT_NE(msg.find("node 'linear'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("defined twice"), std::string::npos) << msg;
}

TEST(IrLoadErrors, DynamicDimensionIsRefusedByName) {
  const auto msg = load_error(with_node("act", [](json& n) { n["outputs"][0]["shape"][0] = "s77"; }));
  EXPECT_NE(msg.find("node 'act'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dynamic"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'s77'"), std::string::npos) << msg;
}

TEST(IrLoadErrors, DynamicStrideIsRefusedToo) {
  const auto msg = load_error(with_node("x", [](json& n) { n["outputs"][0]["strides"][0] = "2*s0"; }));
  EXPECT_NE(msg.find("node 'x'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dynamic"), std::string::npos) << msg;
}

TEST(IrLoadErrors, StridesRankDiffersFromShape) {
  const auto msg = load_error(with_node("linear", [](json& n) { n["outputs"][0]["strides"] = L({1}); }));
  EXPECT_NE(msg.find("node 'linear'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2 dims but 1 strides"), std::string::npos) << msg;
}

TEST(IrLoadErrors, NegativeDimension) {
  const auto msg = load_error(with_node("act", [](json& n) { n["outputs"][0]["shape"][1] = -16; }));
  EXPECT_NE(msg.find("node 'act'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("negative dimension"), std::string::npos) << msg;
}

TEST(IrLoadErrors, TensorTypeLacksAField) {
  const auto msg = load_error(with_node("act", [](json& n) { n["outputs"][0].erase("dtype"); }));
  EXPECT_NE(msg.find("node 'act'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lacks \"dtype\""), std::string::npos) << msg;
}

TEST(IrLoadErrors, PointwiseCallWithoutType) {
  const auto msg = load_error(with_node("act", [](json& n) { n["outputs"] = json::array(); }));
  EXPECT_NE(msg.find("node 'act'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no output tensor type"), std::string::npos) << msg;
}

TEST(IrLoadErrors, KindDisagreesWithOp) {
  const auto msg = load_error(with_node("act", [](json& n) { n["kind"] = "parameter"; }));
  EXPECT_NE(msg.find("node 'act'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not agree with kind"), std::string::npos) << msg;
}

TEST(IrLoadErrors, UnknownKind) {
  const auto msg = load_error(with_node("x", [](json& n) { n["kind"] = "weight"; }));
  EXPECT_NE(msg.find("node 'x'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown kind 'weight'"), std::string::npos) << msg;
}

TEST(IrLoadErrors, WrongFieldTypeIsAUserError) {
  const auto msg = load_error(with_node("x", [](json& n) { n["target"] = 42; }));
  EXPECT_NE(msg.find("wrong type"), std::string::npos) << msg;
}

TEST(IrLoadErrors, MissingOutputsList) {
  json d = small_graph().doc();
  d.erase("outputs");
  EXPECT_NE(load_error(d.dump()).find("has no \"outputs\" list"), std::string::npos);
}

TEST(IrLoadErrors, EmptyOutputsList) {
  json d = small_graph().doc();
  d["outputs"] = json::array();
  EXPECT_NE(load_error(d.dump()).find("the graph has no outputs"), std::string::npos);
}

TEST(IrLoadErrors, MissingNodesList) {
  json d = small_graph().doc();
  d.erase("nodes");
  EXPECT_NE(load_error(d.dump()).find("has no \"nodes\" list"), std::string::npos);
}

TEST(IrLoadErrors, NoUserInput) {
  GraphBuilder b;
  b.param("w", T("f32", {4, 4}));
  b.call("r", "aten.relu.default", {N("w")}, T("f32", {4, 4}));
  const auto msg = load_error(b.str());
  EXPECT_NE(msg.find("no user inputs"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fact::test
