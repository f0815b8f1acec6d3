// Small graphs shaped like what the tracer writes for common modules, and a helper that runs
// discovery on them. Shared by the rule and planner tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "discover/catalog.h"
#include "discover/cost_model.h"
#include "discover/planner.h"
#include "graph_builder.h"

namespace fact::test {

struct Planned {
  ir::Graph g;
  discover::Discovery d;
};

inline Planned plan(const GraphBuilder& b, const std::string& arch = "sm90") {
  Planned p{b.load(), {}};
  const discover::CostModel cost(discover::hardware(arch, ""), p.g.precision);
  p.d = discover::discover(p.g, cost);
  return p;
}

inline std::vector<std::string> names(const ir::Graph& g, const std::vector<int>& ids) {
  std::vector<std::string> out;
  for (int id : ids) out.push_back(g.node(id).name);
  return out;
}

// The chosen patterns of one family.
inline std::vector<const discover::Candidate*> chosen_of(const Planned& p, discover::Family f) {
  std::vector<const discover::Candidate*> out;
  for (const auto& c : p.d.chosen) {
    if (c.match.family == f) out.push_back(&c);
  }
  return out;
}

// The single chosen pattern of a family; a test failure (and nullptr) if not exactly one.
inline const discover::Match* only(const Planned& p, discover::Family f) {
  const auto found = chosen_of(p, f);
  EXPECT_EQ(found.size(), 1u) << "chosen patterns of family " << discover::family_name(f);
  return found.size() == 1 ? &found[0]->match : nullptr;
}

// A fused kernel produces only its output (a horizontal GEMM: each part): every other node it
// replaces must be read only inside the pattern and must not be a graph output, or its value
// would be lost to the rest of the program.
inline void expect_no_escaping_values(const Planned& p) {
  const auto& g = p.g;
  for (const auto& c : p.d.chosen) {
    const auto& m = c.match;
    std::vector<int> outputs = {m.output};
    if (m.family == discover::Family::horizontal_gemm) outputs.insert(outputs.end(), m.anchors.begin(), m.anchors.end());
    auto inside = [&](int id) { return std::find(m.nodes.begin(), m.nodes.end(), id) != m.nodes.end(); };
    for (int id : m.nodes) {
      if (std::find(outputs.begin(), outputs.end(), id) != outputs.end()) continue;
      EXPECT_FALSE(g.is_graph_output(id)) << m.rule << " replaces graph output '" << g.node(id).name << "'";
      for (int u : g.node(id).users) {
        EXPECT_TRUE(inside(u)) << m.rule << " replaces '" << g.node(id).name << "', which '" << g.node(u).name
                               << "' outside the pattern still reads";
      }
    }
  }
}

// Every call node is in exactly one place: a chosen pattern, the PyTorch remainder (compute
// nodes) or the kernel-free remainder (views, identities, asserts); placeholders in none.
// And no pattern swallows a value the rest of the program needs.
inline void expect_nothing_dropped(const Planned& p) {
  expect_no_escaping_values(p);
  const auto& g = p.g;
  std::map<int, int> placed;
  for (const auto& c : p.d.chosen) {
    for (int id : c.match.nodes) ++placed[id];
  }
  for (int id : p.d.uncovered) {
    ++placed[id];
    EXPECT_TRUE(discover::is_compute(g, id)) << g.node(id).name << " is uncovered but computes nothing";
  }
  for (int id : p.d.free) {
    ++placed[id];
    EXPECT_FALSE(discover::is_compute(g, id)) << g.node(id).name << " is listed free but computes";
  }
  for (const auto& n : g.nodes) {
    if (n.is_placeholder()) {
      EXPECT_EQ(placed.count(n.id), 0u) << "placeholder " << n.name << " placed";
    } else {
      EXPECT_EQ(placed[n.id], 1) << "call " << n.name << " placed " << placed[n.id] << " times";
    }
  }
}

inline bool has_miss(const Planned& p, const std::string& rule, const std::string& reason_part) {
  for (const auto& m : p.d.misses) {
    if (m.rule == rule && m.reason.find(reason_part) != std::string::npos) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Graphs

// act(x @ W1^T) * (x @ W3^T), x [16, 64], W [96, 64]. `act`: "silu" (the op), "silu_by_hand"
// (h1 * sigmoid(h1)) or "gelu". The gate is "h1", the up projection "h3", the product "out".
inline GraphBuilder gated_mlp_graph(const std::string& dt = "f32", const std::string& act = "silu",
                                    bool swap = false) {
  GraphBuilder b(dt);
  const json t = T(dt, {16, 96});
  b.input("x", T(dt, {16, 64}));
  b.param("w1", T(dt, {96, 64}));
  b.param("w3", T(dt, {96, 64}));
  b.call("h1", "aten.linear.default", {N("x"), N("w1")}, t);
  if (act == "silu") {
    b.call("a", "aten.silu.default", {N("h1")}, t);
  } else if (act == "gelu") {
    b.call("a", "aten.gelu.default", {N("h1")}, t);
  } else {
    b.call("sg", "aten.sigmoid.default", {N("h1")}, t);
    b.call("a", "aten.mul.Tensor", {N("h1"), N("sg")}, t);
  }
  b.call("h3", "aten.linear.default", {N("x"), N("w3")}, t);
  b.call("out", "aten.mul.Tensor", swap ? std::vector<json>{N("h3"), N("a")} : std::vector<json>{N("a"), N("h3")},
         t);
  return b;
}

// Hand-written causal attention over q, k, v [2, 4, 16, 8]:
//   s = q @ k^T; sc = s * d^-0.5; mf = mask(sc); sm = softmax(mf, dim); o = sm @ v
// mask "tril": masked_fill(sc, eq(tril_buffer, 0), -inf) with the buffer's tril fact;
// mask "additive": sc + triu(full(-inf), 1).
inline GraphBuilder attention_graph(const std::string& mask = "tril", int softmax_dim = -1,
                                    const std::string& dt = "f32") {
  GraphBuilder b(dt);
  const json qkv = T(dt, {2, 4, 16, 8});
  const json scores = T(dt, {2, 4, 16, 16});
  b.input("q", qkv);
  b.input("k", qkv);
  b.input("v", qkv);
  if (mask == "tril") b.buffer("tril", T("bool", {16, 16}), {{"tril", true}});
  b.call("kt", "aten.transpose.int", {N("k"), -2, -1}, T(dt, {2, 4, 8, 16}, std::vector<int64_t>{512, 128, 1, 8}));
  b.call("s", "aten.matmul.default", {N("q"), N("kt")}, scores);
  b.call("sc", "aten.mul.Tensor", {N("s"), 1.0 / std::sqrt(8.0)}, scores);
  if (mask == "tril") {
    b.call("eqm", "aten.eq.Scalar", {N("tril"), 0}, T("bool", {16, 16}));
    b.call("mf", "aten.masked_fill.Scalar", {N("sc"), N("eqm"), Float("-inf")}, scores);
  } else if (mask == "finfo") {  // Hugging Face's: torch.full((s, s), finfo(dtype).min).triu(1)
    const double lowest = dt == "bf16" ? -3.3895313892515355e38 : -3.4028234663852886e38;
    b.call("full", "aten.full.default", {L({16, 16}), lowest}, T(dt, {16, 16}), {{"dtype", DTypeArg(dt)}});
    b.call("tu", "aten.triu.default", {N("full"), 1}, T(dt, {16, 16}));
    b.call("mf", "aten.add.Tensor", {N("sc"), N("tu")}, scores);
  } else {
    b.call("full", "aten.full.default", {L({16, 16}), Float("-inf")}, T(dt, {16, 16}), {{"dtype", DTypeArg(dt)}});
    b.call("tu", "aten.triu.default", {N("full"), 1}, T(dt, {16, 16}));
    b.call("mf", "aten.add.Tensor", {N("sc"), N("tu")}, scores);
  }
  b.call("sm", "aten._softmax.default", {N("mf"), softmax_dim, false}, scores);
  b.call("o", "aten.matmul.default", {N("sm"), N("v")}, qkv);
  return b;
}

}  // namespace fact::test
