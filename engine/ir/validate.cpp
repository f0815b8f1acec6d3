#include "ir/validate.h"

#include "ir/error.h"

namespace fact::ir {

void validate(const Graph& g, const std::string& origin) {
  auto fail = [&](const Node& n, const std::string& what) {
    throw UserError(origin + ": node '" + n.name + "' (" + n.target_op + "): " + what);
  };
  bool has_input = false;
  for (const auto& n : g.nodes) {
    if (n.is_placeholder()) {
      has_input = has_input || n.kind == NodeKind::input;
      if (n.outputs.size() != 1) fail(n, "a placeholder needs exactly one tensor type");
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const auto& t = n.outputs[k];
      if (t.shape.size() != t.strides.size()) {
        fail(n, "output " + std::to_string(k) + " has " + std::to_string(t.shape.size()) +
                    " dims but " + std::to_string(t.strides.size()) + " strides");
      }
      for (auto d : t.shape) {
        if (d < 0) fail(n, "output " + std::to_string(k) + " has a negative dimension");
      }
    }
    const auto cls = op_class(n.op);
    const bool needs_type = cls == OpClass::gemm || cls == OpClass::pointwise ||
                            cls == OpClass::norm || cls == OpClass::attention ||
                            cls == OpClass::softmax || cls == OpClass::reduction;
    if (needs_type && n.outputs.empty()) fail(n, "has no output tensor type; re-trace the module");
  }
  if (g.outputs.empty()) throw UserError(origin + ": the graph has no outputs");
  if (!has_input) {
    throw UserError(origin + ": the graph has no user inputs; FACT needs example inputs to trace");
  }
}

}  // namespace fact::ir
