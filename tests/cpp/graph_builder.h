// Test helper: build FACT graph JSON documents (docs/graph-format.md) in a few lines, then load
// them through the real loader, so every test graph also passes the engine's validation.
//
//   GraphBuilder b;
//   b.input("x", T("f32", {4, 8}));
//   b.param("w", T("f32", {16, 8}));
//   b.call("linear", "aten.linear.default", {N("x"), N("w")}, T("f32", {4, 16}));
//   ir::Graph g = b.load();
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/json_io.h"

namespace fact::test {

using json = nlohmann::json;

inline std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

// A tensor type; strides default to the contiguous ones.
inline json T(const std::string& dtype, const std::vector<int64_t>& shape,
              std::optional<std::vector<int64_t>> strides = std::nullopt) {
  return json{{"dtype", dtype}, {"shape", shape}, {"strides", strides ? *strides : contiguous_strides(shape)}};
}

// Argument values.
inline json N(const std::string& name) { return json{{"node", name}}; }
inline json L(std::initializer_list<int64_t> items) { return json(std::vector<int64_t>(items)); }
inline json Float(const std::string& spelling) { return json{{"float", spelling}}; }  // "-inf"
inline json DTypeArg(const std::string& d) { return json{{"dtype", d}}; }
inline const json None = nullptr;

class GraphBuilder {
 public:
  explicit GraphBuilder(const std::string& dtype = "f32", const std::string& precision = "highest") {
    doc_ = {{"format", "fact.graph"},
            {"version", 1},
            {"source", "test"},
            {"model", "Test"},
            {"dtype", dtype},
            {"float32_matmul_precision", precision},
            {"torch_version", "2.15.0"},
            {"nodes", json::array()},
            {"outputs", json::array()}};
  }

  GraphBuilder& input(const std::string& name, const json& type) { return placeholder(name, "input", type); }
  GraphBuilder& param(const std::string& name, const json& type) { return placeholder(name, "parameter", type); }
  GraphBuilder& buffer(const std::string& name, const json& type, const json& facts = json::object()) {
    placeholder(name, "buffer", type);
    if (!facts.empty()) doc_["nodes"].back()["facts"] = facts;
    return *this;
  }
  GraphBuilder& constant(const std::string& name, const json& type, const json& facts = json::object()) {
    placeholder(name, "constant", type);
    if (!facts.empty()) doc_["nodes"].back()["facts"] = facts;
    return *this;
  }

  // A call node. `out` is one tensor type, a list of them, or null for an op returning nothing.
  GraphBuilder& call(const std::string& name, const std::string& op, const std::vector<json>& args,
                     const json& out, const json& kwargs = json::object(), const std::string& module = "") {
    json outs = out.is_null() ? json::array() : out.is_array() ? out : json::array({out});
    doc_["nodes"].push_back({{"name", name},
                             {"op", op},
                             {"kind", "call"},
                             {"module", module},
                             {"args", args},
                             {"kwargs", kwargs},
                             {"outputs", outs}});
    last_call_ = name;
    return *this;
  }

  GraphBuilder& outputs(const std::vector<std::string>& names) {
    doc_["outputs"] = json::array();
    for (const auto& n : names) doc_["outputs"].push_back(N(n));
    return *this;
  }

  // The document; the graph's output defaults to the last call node.
  json doc() const {
    json d = doc_;
    if (d["outputs"].empty() && !last_call_.empty()) d["outputs"].push_back(N(last_call_));
    return d;
  }
  std::string str() const { return doc().dump(); }
  ir::Graph load() const { return ir::load_graph_string(str(), "test.json"); }

 private:
  GraphBuilder& placeholder(const std::string& name, const std::string& kind, const json& type) {
    doc_["nodes"].push_back(
        {{"name", name}, {"op", "placeholder"}, {"kind", kind}, {"target", name}, {"outputs", json::array({type})}});
    return *this;
  }

  json doc_;
  std::string last_call_;
};

// Node id by name (fails the test through an exception if absent).
inline int id_of(const ir::Graph& g, const std::string& name) { return g.find(name).value(); }

}  // namespace fact::test
