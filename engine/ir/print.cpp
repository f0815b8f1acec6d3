#include "ir/print.h"

#include <string>

namespace fact::ir {
namespace {

std::string arg_text(const Graph& g, const Arg& a) {
  if (a.kind == Arg::Kind::node) {
    return "%" + g.node(a.node).name + (a.output ? "[" + std::to_string(a.output) + "]" : "");
  }
  if (a.kind == Arg::Kind::list) {
    std::string s = "[";
    for (size_t k = 0; k < a.items.size(); ++k) s += (k ? ", " : "") + arg_text(g, a.items[k]);
    return s + "]";
  }
  return a.str();
}

}  // namespace

void print_graph(const Graph& g, std::ostream& os) {
  os << "# fact.graph v" << g.version << " from " << (g.source.empty() ? "?" : g.source) << " ("
     << g.dtype << ", fp32 matmul precision " << g.precision << ")\n";
  for (const auto& n : g.nodes) {
    os << "%" << n.name << " = ";
    if (n.is_placeholder()) {
      os << node_kind_name(n.kind) << " " << n.target;
    } else {
      os << n.target_op << "(";
      bool first = true;
      for (const auto& a : n.args) {
        os << (first ? "" : ", ") << arg_text(g, a);
        first = false;
      }
      for (const auto& [k, a] : n.kwargs) {
        os << (first ? "" : ", ") << k << "=" << arg_text(g, a);
        first = false;
      }
      os << ")";
    }
    if (!n.outputs.empty()) {
      os << " : ";
      for (size_t k = 0; k < n.outputs.size(); ++k) os << (k ? ", " : "") << n.outputs[k].str();
    }
    if (n.op == Op::opaque && !n.is_placeholder()) os << "  [opaque]";
    if (!n.module.empty()) os << "  # " << n.module;
    os << "\n";
  }
  os << "return";
  for (const auto& a : g.outputs) os << " " << arg_text(g, a);
  os << "\n";
}

}  // namespace fact::ir
