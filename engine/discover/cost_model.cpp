#include "discover/cost_model.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "families/gemm/gemm_shape.h"
#include "discover/views.h"
#include "ir/error.h"

namespace fact::discover {

using ir::Graph;
using ir::Node;
using ir::Op;
using ir::OpClass;

namespace {

// H200: measured on the lent H200 through PyTorch (shared/BENCHMARKS.md: bf16 ~790 TFLOP/s,
// TF32 ~390, fp32 SIMT ~51, device copy ~4.3 TB/s). H100 SXM: the same SMs, HBM3 at 3.35 TB/s
// datasheet scaled by the H200's achieved fraction (0.9). A100 SXM 80GB: datasheet (312 / 156 /
// 19.5 TFLOP/s, 2.04 TB/s) scaled by the same achieved fractions. Launch overhead: the gap
// between back-to-back eager kernels, a few microseconds.
const std::vector<Hardware>& table() {
  static const std::vector<Hardware> rows = {
      {"h200", "sm90", 790e12, 390e12, 51e12, 4.3e12, 4e-6},
      {"h100", "sm90", 790e12, 390e12, 51e12, 3.0e12, 4e-6},
      {"a100", "sm80", 250e12, 124e12, 15e12, 1.8e12, 4e-6},
  };
  return rows;
}

int64_t type_bytes(const Graph& g, int id) {
  int64_t b = 0;
  for (const auto& t : g.node(id).outputs) b += t.bytes();
  return b;
}

// Work per element for the unfused pointwise ops (transcendentals count more); it matters only
// for tiny tensors, since these ops are bandwidth-bound.
double pointwise_flops(const Node& n) {
  static const std::set<Op> heavy = {Op::exp, Op::log, Op::tanh, Op::sigmoid, Op::gelu, Op::silu,
                                     Op::mish, Op::erf, Op::softplus, Op::pow, Op::rsqrt, Op::sqrt};
  return (heavy.count(n.op) ? 8.0 : 1.0) * static_cast<double>(n.type().numel());
}

}  // namespace

const Hardware& hardware(const std::string& arch, const std::string& gpu) {
  for (const auto& h : table()) {
    if (gpu.empty() ? h.arch == arch : h.gpu == gpu) {
      if (!arch.empty() && h.arch != arch) {
        throw UserError("--gpu " + gpu + " is an " + h.arch + " part, not " + arch);
      }
      return h;
    }
  }
  if (gpu.empty()) throw UserError("unknown --arch '" + arch + "' (expected sm90 or sm80)");
  throw UserError("unknown --gpu '" + gpu + "' (expected h200, h100 or a100)");
}

std::vector<std::string> known_gpus() {
  std::vector<std::string> names;
  for (const auto& h : table()) names.push_back(h.gpu);
  return names;
}

double CostModel::matmul_rate(ir::DType dtype) const {
  switch (dtype) {
    case ir::DType::bf16:
    case ir::DType::f16:
      return hw_.bf16_flops;
    case ir::DType::f32:
      if (precision_ == "medium") return hw_.bf16_flops;
      if (precision_ == "high") return hw_.tf32_flops;
      return hw_.fp32_flops;
    default:
      return hw_.fp32_flops / 2;
  }
}

Cost CostModel::finish(Cost c, double rate) const {
  const double compute = rate > 0 ? c.flops / rate : 0;
  c.seconds = c.launches * hw_.launch_s + std::max(compute, c.bytes / hw_.bandwidth);
  return c;
}

Cost CostModel::node(const Graph& g, int id) const {
  const Node& n = g.node(id);
  Cost c;
  if (n.is_placeholder() || n.outputs.empty()) return c;
  const auto cls = ir::op_class(n.op);
  if (cls == OpClass::view || cls == OpClass::meta || is_identity(g, n)) return c;
  const double out_bytes = static_cast<double>(type_bytes(g, id));
  double in_bytes = 0;
  for (int o : g.operands(n)) in_bytes += static_cast<double>(type_bytes(g, o));
  c.launches = 1;
  c.bytes = in_bytes + out_bytes;
  double rate = hw_.fp32_flops;
  switch (cls) {
    case OpClass::gemm: {
      GemmShape s;
      std::string why;
      if (gemm_shape(g, id, s, why)) {
        c.flops = 2.0 * static_cast<double>(s.batch * s.m) * static_cast<double>(s.n * s.k);
        rate = matmul_rate(g.node(s.a).type().dtype);
        // A strided operand is copied first (PyTorch makes it contiguous).
        if (s.layout_a == "strided") c.bytes += 2.0 * static_cast<double>(type_bytes(g, s.a));
      }
      break;
    }
    case OpClass::attention: {
      const auto& q = g.node(first_operand(n)).type();
      const auto& o = n.type();
      const double sk = static_cast<double>(g.node(g.operands(n).at(1)).type().shape.at(static_cast<size_t>(q.rank() - 2)));
      c.flops = 4.0 * static_cast<double>(o.numel()) * sk;  // QK^T and PV
      const ir::Arg* causal = n.arg(5, "is_causal");
      if (causal && causal->kind == ir::Arg::Kind::boolean && causal->b) c.flops /= 2;
      rate = matmul_rate(q.dtype);
      break;
    }
    case OpClass::pointwise:
    case OpClass::cast:
      c.flops = pointwise_flops(n);
      break;
    case OpClass::creation:
      c.bytes = out_bytes;
      break;
    default:
      c.flops = static_cast<double>(n.outputs[0].numel()) * 4.0;
      break;
  }
  return finish(c, rate);
}

Cost CostModel::unfused(const Graph& g, const std::vector<int>& nodes) const {
  Cost total;
  for (int id : nodes) {
    const Cost c = node(g, id);
    total.flops += c.flops;
    total.bytes += c.bytes;
    total.launches += c.launches;
    total.seconds += c.seconds;
  }
  return total;
}

Cost CostModel::fused(const Graph& g, const Match& m) const {
  Cost c;
  c.launches = 1;
  std::set<int> read;
  for (const auto& o : m.operands) {
    if (read.insert(see_through(g, o.node).source).second) c.bytes += static_cast<double>(type_bytes(g, o.node));
  }
  const auto& out = g.node(m.output).type();
  c.bytes += static_cast<double>(out.bytes());
  double rate = hw_.fp32_flops;
  const auto& p = m.problem;
  switch (m.family) {
    case Family::gemm:
    case Family::horizontal_gemm:
      c.flops = 2.0 * p["batch"].get<double>() * p["m"].get<double>() * p["n"].get<double>() * p["k"].get<double>();
      rate = matmul_rate(g.node(m.operands[0].node).type().dtype);
      if (m.family == Family::horizontal_gemm) {
        // Every part's output is written, not just the first.
        c.bytes -= static_cast<double>(out.bytes());
        for (int id : m.anchors) c.bytes += static_cast<double>(g.node(id).type().bytes());
      }
      break;
    case Family::gated_mlp:
      c.flops = 2.0 * 2.0 * p["m"].get<double>() * p["n"].get<double>() * p["k"].get<double>();
      rate = matmul_rate(g.node(m.operands[0].node).type().dtype);
      break;
    case Family::attention: {
      const double bh = p["batch"].get<double>() * p["heads"].get<double>();
      c.flops = 2.0 * bh * p["seq_q"].get<double>() * p["seq_k"].get<double>() *
                (p["head_dim"].get<double>() + p["head_dim_v"].get<double>());
      if (m.attrs.value("causal", false)) c.flops /= 2;
      rate = matmul_rate(g.node(m.operands[0].node).type().dtype);
      break;
    }
    case Family::norm:
      c.flops = 8.0 * static_cast<double>(out.numel());
      break;
    case Family::pointwise:
      c.flops = static_cast<double>(m.epilogue.size()) * static_cast<double>(out.numel());
      break;
  }
  return finish(c, rate);
}

}  // namespace fact::discover
