#include "ir/validate.h"

#include "ir/error.h"

namespace fact::ir {

namespace {

std::string dims(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The GEMM ops' operands and output agree (the rules and emitters read their sizes from them):
// a linear's weight is [n, k] for an input [.., k] and an output [.., n], its bias [n]; mm and
// bmm take [.., m, k] and [.., k, n]; addmm adds its first argument to mm's result.
template <class Fail>
void check_gemm_shapes(const Graph& g, const Node& n, const Fail& fail) {
  auto tensor = [&](int pos, const char* key) -> const TensorType* {
    const Arg* a = n.arg(pos, key);
    if (!a || !a->is_node()) return nullptr;
    const auto& src = g.node(a->node);
    return src.outputs.size() == 1 ? &src.outputs[0] : nullptr;
  };
  auto need = [&](const TensorType* t, const char* what) {
    if (!t) fail(n, std::string("needs a tensor ") + what + " argument");
    return t;
  };
  const auto& out = n.outputs.at(0);
  if (n.op == Op::linear) {
    const auto* x = need(tensor(0, "input"), "input");
    const auto* w = need(tensor(1, "weight"), "weight");
    const auto* b = tensor(2, "bias");
    // A 1-D weight [k] is a dot product over the last dim: the output drops it.
    const bool vector = w->rank() == 1;
    const int64_t n_out = vector ? -1 : (w->rank() == 2 ? w->shape[0] : -2);
    const bool fits =
        x->rank() >= 1 && (w->rank() == 1 || w->rank() == 2) && w->shape.back() == x->shape.back() &&
        (vector ? out.rank() == x->rank() - 1 : out.rank() >= 1 && out.shape.back() == n_out) &&
        (!b || vector || (b->rank() <= 1 && (b->rank() == 0 || b->shape[0] == n_out || b->shape[0] == 1)));
    if (!fits) {
      fail(n, "a linear of input " + dims(x->shape) + ", weight " + dims(w->shape) +
                  (b ? ", bias " + dims(b->shape) : std::string()) + " cannot give " + dims(out.shape) +
                  " (the weight must be [out, in], the bias [out])");
    }
  } else if (n.op == Op::mm || n.op == Op::bmm || n.op == Op::addmm || n.op == Op::baddbmm) {
    const bool add = n.op == Op::addmm || n.op == Op::baddbmm;
    const auto* a = need(tensor(add ? 1 : 0, add ? "mat1" : "self"), "first matrix");
    const auto* b = need(tensor(add ? 2 : 1, add ? "mat2" : "mat2"), "second matrix");
    const int rank = (n.op == Op::bmm || n.op == Op::baddbmm) ? 3 : 2;
    if (a->rank() != rank || b->rank() != rank || a->shape[rank - 1] != b->shape[rank - 2] || out.rank() != rank ||
        out.shape[rank - 2] != a->shape[rank - 2] || out.shape[rank - 1] != b->shape[rank - 1]) {
      fail(n, "a product of " + dims(a->shape) + " and " + dims(b->shape) + " cannot give " + dims(out.shape));
    }
  } else if (n.op == Op::matmul) {
    const auto* a = need(tensor(0, "self"), "first");
    const auto* b = need(tensor(1, "other"), "second");
    const int64_t k = a->rank() ? a->shape.back() : -1;
    const int64_t kb = b->rank() >= 2 ? b->shape[b->rank() - 2] : b->rank() == 1 ? b->shape[0] : -2;
    if (k != kb) fail(n, "matmul of " + dims(a->shape) + " and " + dims(b->shape) + ": inner sizes differ");
  }
}

}  // namespace

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
    // Ops that make one tensor: the rules read that one type (native_layer_norm and the SDPA
    // kernels' own ops return several, and are read output by output).
    const bool single = cls == OpClass::gemm || cls == OpClass::pointwise || cls == OpClass::softmax ||
                        n.op == Op::layer_norm || n.op == Op::rms_norm || n.op == Op::group_norm || n.op == Op::sdpa;
    if (single && n.outputs.size() != 1) {
      fail(n, "has " + std::to_string(n.outputs.size()) + " output tensor types; the op makes one");
    }
    if (cls == OpClass::gemm) check_gemm_shapes(g, n, fail);
  }
  if (g.outputs.empty()) throw UserError(origin + ": the graph has no outputs");
  if (!has_input) {
    throw UserError(origin + ": the graph has no user inputs; FACT needs example inputs to trace");
  }
}

}  // namespace fact::ir
