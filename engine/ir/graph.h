// The FACT graph: an ATen-level program traced by torch.export (docs/graph-format.md).
//
// Nodes are stored in program order, so a node's operands always precede it. Node ids are
// indices into Graph::nodes. Users are derived when the graph is loaded.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ir/ops.h"

namespace fact::ir {

enum class DType { f64, f32, f16, bf16, f8e4m3, f8e5m2, i64, i32, i16, i8, u8, boolean, c64, c128, other };

const char* dtype_name(DType d);
std::optional<DType> dtype_from_name(const std::string& name);
int dtype_bytes(DType d);
bool is_floating(DType d);

struct TensorType {
  DType dtype = DType::f32;
  std::string dtype_spelling;  // as written, for dtypes FACT has no enum for
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;

  int rank() const { return static_cast<int>(shape.size()); }
  int64_t numel() const;
  int64_t bytes() const { return numel() * dtype_bytes(dtype); }
  bool is_contiguous() const;
  std::string str() const;  // "bf16[128, 512, 768]"
};

// An argument value: a node's output, a constant, or a list of those.
struct Arg {
  enum class Kind { none, node, integer, real, boolean, string, list, enum_value, symbol, other };
  Kind kind = Kind::none;
  int node = -1;    // Kind::node: producing node id
  int output = 0;   // Kind::node: which of its outputs
  int64_t i = 0;    // Kind::integer
  double f = 0;     // Kind::real
  bool b = false;   // Kind::boolean
  std::string s;    // string, enum value ("bf16"), symbol, other (repr)
  std::string tag;  // Kind::enum_value: "dtype", "device", "layout", "memory_format"
  std::vector<Arg> items;

  bool is_node() const { return kind == Kind::node; }
  bool is_number() const { return kind == Kind::integer || kind == Kind::real; }
  double number() const { return kind == Kind::integer ? static_cast<double>(i) : f; }
  std::string str() const;
};

enum class NodeKind { input, parameter, buffer, constant, call };
const char* node_kind_name(NodeKind k);

struct Node {
  int id = -1;
  std::string name;
  std::string target_op;  // "aten.linear.default", "placeholder", "getitem", "python.x.y"
  Op op = Op::opaque;     // canonical op; Op::opaque when the vocabulary does not know target_op
  NodeKind kind = NodeKind::call;
  std::string target;  // placeholder: FQN or input name
  std::string module;  // calls: issuing nn.Module path
  std::vector<Arg> args;
  std::map<std::string, Arg> kwargs;
  std::vector<TensorType> outputs;
  std::map<std::string, double> facts;  // buffers/constants: "tril", "causal_additive", "value"
  std::vector<int> users;  // derived: nodes that read an output of this one, except meta nodes
                           // (shape assertions), which check but never block a fusion

  bool is_placeholder() const { return kind != NodeKind::call; }
  const TensorType& type() const;  // the single output; internal error otherwise
  // Positional-or-keyword argument lookup (`pos` < 0: keyword only).
  const Arg* arg(int pos, const std::string& name = "") const;
  bool has_fact(const std::string& key) const { return facts.count(key) != 0; }
};

struct Graph {
  int version = 1;
  std::string source;
  std::string model;
  std::string dtype;      // the module's dtype at trace time ("bf16", "f32", "mixed")
  std::string precision;  // float32 matmul precision: highest | high | medium
  std::string torch_version;
  std::vector<Node> nodes;
  std::vector<Arg> outputs;
  std::map<std::string, int> by_name;
  // Op::lowered nodes' expressions, by ATen base name (discover/lowering.h): checked data.
  std::map<std::string, nlohmann::json> lowerings;

  const Node& node(int id) const { return nodes.at(static_cast<size_t>(id)); }
  std::optional<int> find(const std::string& name) const;
  int size() const { return static_cast<int>(nodes.size()); }
  // Recompute users and the name index (called by the loader and by tests building graphs).
  void finalize();
  // Node ids of the tensor operands of `n` (args and kwargs, lists flattened), in order.
  std::vector<int> operands(const Node& n) const;
  bool is_graph_output(int id) const;

 private:
  bool write_unobserved(const Node& n) const;
};

}  // namespace fact::ir
