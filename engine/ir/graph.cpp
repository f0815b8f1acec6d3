#include "ir/graph.h"

#include <sstream>

#include "ir/error.h"

namespace fact {

void internal_error(const char* file, int line, const std::string& what) {
  std::ostringstream os;
  os << "internal error (a bug in FACT) at " << file << ":" << line << ": " << what;
  throw InternalError(os.str());
}

}  // namespace fact

namespace fact::ir {
namespace {

struct DTypeRow {
  DType d;
  const char* name;
  int bytes;
  bool floating;
};

constexpr DTypeRow kDTypes[] = {
    {DType::f64, "f64", 8, true},       {DType::f32, "f32", 4, true},
    {DType::f16, "f16", 2, true},       {DType::bf16, "bf16", 2, true},
    {DType::f8e4m3, "f8e4m3", 1, true}, {DType::f8e5m2, "f8e5m2", 1, true},
    {DType::i64, "i64", 8, false},      {DType::i32, "i32", 4, false},
    {DType::i16, "i16", 2, false},      {DType::i8, "i8", 1, false},
    {DType::u8, "u8", 1, false},        {DType::boolean, "bool", 1, false},
    {DType::c64, "c64", 8, false},      {DType::c128, "c128", 16, false},
    {DType::other, "other", 4, false},
};

const DTypeRow& row(DType d) {
  for (const auto& r : kDTypes) {
    if (r.d == d) return r;
  }
  FACT_CHECK(false, "dtype missing from table");
}

}  // namespace

const char* dtype_name(DType d) { return row(d).name; }
int dtype_bytes(DType d) { return row(d).bytes; }
bool is_floating(DType d) { return row(d).floating; }

std::optional<DType> dtype_from_name(const std::string& name) {
  for (const auto& r : kDTypes) {
    if (name == r.name && r.d != DType::other) return r.d;
  }
  return std::nullopt;
}

int64_t TensorType::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

bool TensorType::is_contiguous() const {
  int64_t expected = 1;
  for (int i = rank() - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

std::string TensorType::str() const {
  std::ostringstream os;
  os << (dtype == DType::other ? dtype_spelling : dtype_name(dtype)) << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

std::string Arg::str() const {
  std::ostringstream os;
  switch (kind) {
    case Kind::none: return "None";
    case Kind::node: return "%" + std::to_string(node) + (output ? "." + std::to_string(output) : "");
    case Kind::integer: return std::to_string(i);
    case Kind::real: os << f; return os.str();
    case Kind::boolean: return b ? "True" : "False";
    case Kind::string: return "\"" + s + "\"";
    case Kind::enum_value: return tag + ":" + s;
    case Kind::symbol: return s;
    case Kind::other: return s;
    case Kind::list:
      os << "[";
      for (size_t k = 0; k < items.size(); ++k) os << (k ? ", " : "") << items[k].str();
      os << "]";
      return os.str();
  }
  return "?";
}

const char* node_kind_name(NodeKind k) {
  switch (k) {
    case NodeKind::input: return "input";
    case NodeKind::parameter: return "parameter";
    case NodeKind::buffer: return "buffer";
    case NodeKind::constant: return "constant";
    case NodeKind::call: return "call";
  }
  return "?";
}

const TensorType& Node::type() const {
  FACT_CHECK(outputs.size() == 1, "node '" + name + "' does not have exactly one tensor output");
  return outputs[0];
}

const Arg* Node::arg(int pos, const std::string& key) const {
  if (pos >= 0 && static_cast<size_t>(pos) < args.size()) return &args[static_cast<size_t>(pos)];
  if (!key.empty()) {
    auto it = kwargs.find(key);
    if (it != kwargs.end()) return &it->second;
  }
  return nullptr;
}

std::optional<int> Graph::find(const std::string& name) const {
  auto it = by_name.find(name);
  if (it == by_name.end()) return std::nullopt;
  return it->second;
}

namespace {
void collect_nodes(const Arg& a, std::vector<int>& out) {
  if (a.kind == Arg::Kind::node) out.push_back(a.node);
  for (const auto& item : a.items) collect_nodes(item, out);
}
}  // namespace

std::vector<int> Graph::operands(const Node& n) const {
  std::vector<int> ids;
  for (const auto& a : n.args) collect_nodes(a, ids);
  for (const auto& [k, a] : n.kwargs) collect_nodes(a, ids);
  return ids;
}

void Graph::finalize() {
  by_name.clear();
  for (size_t i = 0; i < nodes.size(); ++i) {
    nodes[i].id = static_cast<int>(i);
    nodes[i].users.clear();
    by_name[nodes[i].name] = static_cast<int>(i);
  }
  for (auto& n : nodes) {
    if (op_class(n.op) == OpClass::meta) continue;  // assertions never block a fusion
    for (int src : operands(n)) {
      auto& users = nodes.at(static_cast<size_t>(src)).users;
      if (users.empty() || users.back() != n.id) users.push_back(n.id);
    }
  }
  for (auto& n : nodes) {
    if (n.op != Op::opaque && in_place_target(n.target_op) && !write_unobserved(n)) n.op = Op::opaque;
  }
}

// An in-place pointwise op (y.add_(1)) reads as its functional form when no one can see the
// write: its tensor is fresh storage this graph made (not an input, parameter or buffer, not a
// view or alias of another tensor), and nothing reads it afterwards under its old name, through an
// alias, or as a graph output. Later readers name the in-place node itself, so they still see its
// value. Anything else stays opaque and runs in PyTorch as written.
bool Graph::write_unobserved(const Node& n) const {
  if (n.args.empty() || !n.args[0].is_node()) return false;
  const Node& base = node(n.args[0].node);
  if (base.outputs.size() != 1) return false;
  switch (op_class(base.op)) {
    case OpClass::gemm:
    case OpClass::pointwise:  // an in-place one that stayed is fresh storage by the same rule
    case OpClass::reduction:
    case OpClass::softmax:
    case OpClass::norm:
    case OpClass::attention:
    case OpClass::creation:
      break;
    case OpClass::identity:
      if (base.op != Op::clone && base.op != Op::lift_fresh_copy) return false;
      break;
    case OpClass::copy:
      if (base.op != Op::cat && base.op != Op::stack) return false;  // contiguous may return self
      break;
    default:
      return false;
  }
  if (is_graph_output(base.id)) return false;
  for (int u : base.users) {
    if (u == n.id) continue;
    if (u > n.id) return false;
    // An earlier reader must be one known to make new storage: an alias it returned (a view, an
    // identity, a same-dtype cast, an op the catalog does not know, such as diagonal or unfold)
    // would see the write later.
    const Op op = node(u).op;
    switch (op_class(op)) {
      case OpClass::gemm:
      case OpClass::pointwise:
      case OpClass::reduction:
      case OpClass::softmax:
      case OpClass::norm:
      case OpClass::attention:
        break;
      case OpClass::copy:
        if (op != Op::cat && op != Op::stack && op != Op::repeat && op != Op::repeat_interleave) return false;
        break;
      default:
        return false;
    }
  }
  return true;
}

bool Graph::is_graph_output(int id) const {
  std::vector<int> ids;
  for (const auto& a : outputs) collect_nodes(a, ids);
  for (int x : ids) {
    if (x == id) return true;
  }
  return false;
}

}  // namespace fact::ir
