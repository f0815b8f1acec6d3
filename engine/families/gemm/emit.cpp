#include "families/gemm/emit.h"
#include "families/pointwise/pointwise.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <cstdio>
#include <set>
#include <sstream>

#include "discover/expr.h"
#include "ir/error.h"
#include "realize_templates.h"

namespace fact::realize {


using nlohmann::json;


namespace {

std::string float_literal(const json& v) {
  FACT_CHECK(v.is_number() || v.is_string(), "epilogue constant is neither a number nor inf/nan: " + v.dump());
  if (v.is_string()) {
    const auto s = v.get<std::string>();
    if (s == "inf") return "INFINITY";
    if (s == "-inf") return "(-INFINITY)";
    return "NAN";
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9gf", v.get<double>());
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s.insert(s.size() - 1, ".0");
  return s;
}

// Transcendentals of the epilogue. A 16-bit output rounds to 8 (bf16) or 11 (fp16) bits, so the
// hardware approximations (tanh.approx, ex2.approx: relative error ~2^-11) are below its rounding
// and cost one MUFU instruction instead of tens; f32 outputs keep the accurate libm calls.
struct MathFns {
  std::string tanh = "tanhf", exp = "expf";
};

// One function of the epilogue as a C++ float expression over its argument variables.
std::string function_expr(const json& e, const std::vector<std::string>& a, const MathFns& m) {
  const std::string fn = e.at("op");
  std::vector<std::string> p;
  if (e.contains("params")) {
    for (const auto& v : e["params"]) p.push_back(float_literal(v));
  }
  auto param = [&](size_t i, const char* dflt) { return i < p.size() ? p[i] : std::string(dflt); };
  auto cmp = [&](const char* op) { return "(" + a[0] + " " + op + " " + a[1] + " ? 1.0f : 0.0f)"; };
  if (fn == "add") return a[0] + " + " + a[1];
  if (fn == "sub") return a[0] + " - " + a[1];
  if (fn == "mul") return a[0] + " * " + a[1];
  if (fn == "div") return a[0] + " / " + a[1];
  if (fn == "minimum") return "fact_min(" + a[0] + ", " + a[1] + ")";
  if (fn == "maximum") return "fact_max(" + a[0] + ", " + a[1] + ")";
  if (fn == "pow") return "powf(" + a[0] + ", " + a[1] + ")";
  if (fn == "where") return "(" + a[0] + " != 0.0f ? " + a[1] + " : " + a[2] + ")";
  if (fn == "eq") return cmp("==");
  if (fn == "ne") return cmp("!=");
  if (fn == "lt") return cmp("<");
  if (fn == "le") return cmp("<=");
  if (fn == "gt") return cmp(">");
  if (fn == "ge") return cmp(">=");
  if (fn == "logical_not") return "(" + a[0] + " == 0.0f ? 1.0f : 0.0f)";
  if (fn == "neg") return "-" + a[0];
  if (fn == "exp") return m.exp + "(" + a[0] + ")";
  if (fn == "log") return "logf(" + a[0] + ")";
  if (fn == "log1p") return "log1pf(" + a[0] + ")";
  if (fn == "expm1") return "expm1f(" + a[0] + ")";
  if (fn == "sqrt") return "sqrtf(" + a[0] + ")";
  if (fn == "rsqrt") return "rsqrtf(" + a[0] + ")";
  if (fn == "reciprocal") return "1.0f / " + a[0];
  if (fn == "abs") return "fabsf(" + a[0] + ")";
  if (fn == "square") return a[0] + " * " + a[0];
  if (fn == "erf") return "erff(" + a[0] + ")";
  if (fn == "sin") return "sinf(" + a[0] + ")";
  if (fn == "cos") return "cosf(" + a[0] + ")";
  if (fn == "tanh") return m.tanh + "(" + a[0] + ")";
  if (fn == "sigmoid") return "1.0f / (1.0f + " + m.exp + "(-" + a[0] + "))";
  if (fn == "relu") return "fact_max(" + a[0] + ", 0.0f)";
  if (fn == "silu") return a[0] + " / (1.0f + " + m.exp + "(-" + a[0] + "))";
  if (fn == "gelu_erf") return "0.5f * " + a[0] + " * (1.0f + erff(" + a[0] + " * 0.70710678118654752f))";
  if (fn == "gelu_tanh") {
    return "0.5f * " + a[0] + " * (1.0f + " + m.tanh + "(0.79788456080286536f * (" + a[0] + " + 0.044715f * " + a[0] +
           " * " + a[0] + " * " + a[0] + ")))";
  }
  if (fn == "softplus") {
    const auto beta = param(0, "1.0f"), threshold = param(1, "20.0f");
    return "(" + beta + " * " + a[0] + " > " + threshold + " ? " + a[0] + " : log1pf(" + m.exp + "(" + beta + " * " + a[0] +
           ")) / " + beta + ")";
  }
  if (fn == "mish") return a[0] + " * " + m.tanh + "(" + a[0] + " > 20.0f ? " + a[0] + " : log1pf(" + m.exp + "(" + a[0] + ")))";
  if (fn == "hardswish") return a[0] + " * fact_min(fact_max(" + a[0] + " + 3.0f, 0.0f), 6.0f) / 6.0f";
  if (fn == "hardsigmoid") return "fact_min(fact_max(" + a[0] + " + 3.0f, 0.0f), 6.0f) / 6.0f";
  if (fn == "leaky_relu") return "(" + a[0] + " >= 0.0f ? " + a[0] + " : " + a[0] + " * " + param(0, "0.01f") + ")";
  if (fn == "hardtanh") return "fact_min(fact_max(" + a[0] + ", " + param(0, "-1.0f") + "), " + param(1, "1.0f") + ")";
  if (fn == "clamp") return "fact_min(fact_max(" + a[0] + ", " + param(0, "(-INFINITY)") + "), " + param(1, "INFINITY") + ")";
  if (fn == "elu") {
    return param(1, "1.0f") + " * (" + a[0] + " > 0.0f ? " + a[0] + " : " + param(0, "1.0f") + " * (" + m.exp + "(" + a[0] +
           " * " + param(2, "1.0f") + ") - 1.0f))";
  }
  if (fn == "cast") {
    const std::string dtype = e.value("dtype", "f32");
    if (dtype == "bf16") return "float(cutlass::bfloat16_t(" + a[0] + "))";
    if (dtype == "f16") return "float(cutlass::half_t(" + a[0] + "))";
    if (dtype == "f32" || dtype == "f64") return a[0];
    throw NotSupported("a cast to " + dtype + " inside an epilogue");
  }
  throw NotSupported("epilogue function '" + fn + "' has no CUDA emission yet");
}

// The functor body: one `const float vN = ...;` per SSA entry, then out[i] = v<root>.
std::string functor_body(const json& ssa, size_t n_operands, const MathFns& math) {
  std::ostringstream os;
  std::string last;
  for (const auto& e : ssa) {
    const std::string v = "v" + std::to_string(e.at("id").get<int>());
    const std::string op = e.at("op");
    std::string rhs;
    if (op == "acc") {
      rhs = "x0[i]";
    } else if (op == "operand") {
      const int idx = e.at("index");
      FACT_CHECK(static_cast<size_t>(idx) < n_operands, "epilogue operand index out of range");
      rhs = "x" + std::to_string(idx + 1) + "[i]";
    } else if (op == "constant") {
      rhs = float_literal(e.at("value"));
    } else {
      std::vector<std::string> args;
      for (const auto& a : e.at("args")) args.push_back("v" + std::to_string(a.get<int>()));
      rhs = function_expr(e, args, math);
    }
    os << "      const float " << v << " = " << rhs << ";\n";
    last = v;
  }
  os << "      out[i] = " << last << ";";
  return os.str();
}


}  // namespace



GemmSpec GemmSpec::from_pattern(const json& p) {
  GemmSpec s;
  s.family = p.at("family");
  if (s.family != "gemm" && s.family != "horizontal_gemm") {
    throw NotSupported("family " + s.family + " has no GEMM kernel template yet");
  }
  const auto& a = p.at("attrs");
  s.dtype_a = a.at("dtype_a");
  s.dtype_b = a.at("dtype_b");
  s.dtype_out = a.at("dtype_out");
  s.layout_a = a.at("layout_a");
  s.layout_b = a.at("layout_b");
  if (s.layout_a == "strided" || s.layout_b == "strided") {
    throw NotSupported("an operand is neither row- nor column-major (a strided view needs a copy)");
  }
  if (s.dtype_a != s.dtype_b) throw NotSupported("mixed A/B dtypes (" + s.dtype_a + ", " + s.dtype_b + ")");
  // Epilogue operands follow A and B in the plan's operand list.
  const auto& ops = p.at("operands");
  for (size_t i = 0; i < ops.size(); ++i) {
    const std::string role = ops[i].at("role");
    if (role == "a" || role == "b") continue;
    EpilogueOperand o;
    o.kind = ops[i].value("broadcast", "");
    o.node = ops[i].value("node", "");
    const std::string type = ops[i].value("type", "");
    o.dtype = type.substr(0, type.find('['));
    if (o.kind.empty()) throw NotSupported("operand '" + o.node + "' has no broadcast kind");
    s.operands.push_back(o);
  }
  if (p.contains("epilogue_expr")) {
    s.ssa = p["epilogue_expr"].at("ssa");
    check_expression_size(s.ssa);
  } else {
    // Horizontal fusion: acc, plus a bias row when the parts have one (each part's own, read
    // by the grouped kernel at its part; a part without one adds zeros).
    s.ssa = json::array({{{"id", 0}, {"op", "acc"}}});
    s.epilogue_text = "acc";
    if (!s.operands.empty()) {
      s.operands.resize(1);  // one row operand: the parts' biases, given per part at run time
      s.ssa.push_back({{"id", 1}, {"op", "operand"}, {"index", 0}});
      s.ssa.push_back({{"id", 2}, {"op", "add"}, {"args", {0, 1}}});
      s.epilogue_text = "acc + bias";
    }
  }
  // The text that goes into the source names operands by position, not by graph node, so the
  // same kernel for another model is the same source (and the same cache entry).
  std::vector<std::string> names;
  for (size_t i = 0; i < s.operands.size(); ++i) names.push_back("op" + std::to_string(i));
  s.epilogue_text = discover::ExprGraph::from_json(s.ssa).to_text(names);
  int full = 0;
  for (const auto& o : s.operands) full += o.kind == "full" ? 1 : 0;
  if (full > 1) throw NotSupported("more than one full-size epilogue operand (only C is fetched so far)");
  if (s.operands.size() > 8) throw NotSupported("more than 8 epilogue operands");
  return s;
}

std::string GemmSpec::id() const {
  json j = {{"family", family}, {"a", dtype_a}, {"b", dtype_b}, {"out", dtype_out}, {"la", layout_a},
            {"lb", layout_b}, {"ssa", ssa}};
  for (const auto& o : operands) j["ops"].push_back({o.kind, o.dtype});
  return short_hash(j.dump());
}



json lower_gated_mlp(const json& p) {
  if (p.at("family") != "gated_mlp") throw NotSupported("not a gated MLP pattern");
  const auto& attrs = p.at("attrs");
  const std::string act = attrs.value("activation", "");
  static const std::set<std::string> acts = {"silu", "gelu_tanh", "gelu_erf", "relu"};
  if (!acts.count(act)) throw NotSupported("gated MLP activation '" + act + "' has no epilogue form");
  if (p.at("problem").value("batch", 1) != 1) throw NotSupported("batched gated MLP");
  json a, gate;
  for (const auto& o : p.at("operands")) {
    if (o.value("role", "") == "a") a = o;
    if (o.value("role", "") == "b_gate") gate = o;
  }
  if (a.is_null() || gate.is_null() || !attrs.contains("up")) {
    throw NotSupported("gated MLP pattern without its input, gate weight or up projection");
  }
  // The up projection's output: the input's leading dims with n columns, in the output dtype.
  const std::string a_type = a.value("type", "");
  const auto open = a_type.find('['), last = a_type.rfind(',');
  std::string up_type = attrs.value("dtype_out", "") + "[" + std::to_string(p.at("problem").at("n").get<int64_t>()) + "]";
  if (open != std::string::npos && last != std::string::npos && last > open) {
    up_type = attrs.value("dtype_out", "") + a_type.substr(open, last - open + 1) + " " +
              std::to_string(p.at("problem").at("n").get<int64_t>()) + "]";
  }
  json out = p;
  out["family"] = "gemm";
  out["rule"] = "gated_mlp_lowered";
  out["anchors"] = json::array({attrs.at("gate")});
  json g = gate;
  g["role"] = "b";
  out["operands"] = json::array({a, g, {{"role", "up"}, {"node", attrs.at("up")}, {"type", up_type}, {"broadcast", "full"}}});
  out["epilogue"] = json::array({act, "mul"});
  out["epilogue_expr"] = {{"text", act + "(acc) * up"},
                          {"ssa", json::array({{{"id", 0}, {"op", "acc"}},
                                               {{"id", 1}, {"op", "operand"}, {"index", 0}},
                                               {{"id", 2}, {"op", act}, {"args", {0}}},
                                               {{"id", 3}, {"op", "mul"}, {"args", {2, 1}}}})}};
  out["signature"] = "gemm[" + act + "+mul]:" + attrs.value("dtype_a", "") + "," + attrs.value("dtype_b", "") + "->" +
                     attrs.value("dtype_out", "") + ":" + attrs.value("layout_a", "") + "," +
                     attrs.value("layout_b", "");  // as registry::signature of that GEMM
  out.erase("lowered");
  return out;
}

namespace {

// A GEMM epilogue's SSA over acc and operands as a pointwise region's over inputs: acc becomes
// input 0, operand i input i + 1 (how both tails read their inputs).
json ssa_over_inputs(const json& ssa_in) {
  json ssa = ssa_in;
  for (auto& e : ssa) {
    if (e.at("op") == "acc") {
      e = {{"id", e.at("id")}, {"op", "operand"}, {"index", 0}};
    } else if (e.at("op") == "operand") {
      e["index"] = e.at("index").get<int>() + 1;
    }
  }
  return ssa;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  int64_t step = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = step;
    step *= shape[d];
  }
  return strides;
}

std::string steps_text(const json& epilogue) {
  std::string steps;
  for (const auto& step : epilogue) steps += (steps.empty() ? "" : "+") + step.get<std::string>();
  return steps;
}

}  // namespace

json gated_mlp_tail(const json& lowered) {
  const auto& attrs = lowered.at("attrs");
  json up;
  for (const auto& o : lowered.at("operands")) {
    if (o.value("role", "") == "up") up = o;
  }
  if (up.is_null()) throw NotSupported("a lowered gated MLP without its up operand");
  // acc (the gate) is input 0
  const json ssa = ssa_over_inputs(lowered.at("epilogue_expr").at("ssa"));
  const std::vector<int64_t> shape = type_shape(up.value("type", ""));
  if (shape.empty()) throw NotSupported("the up projection's output has no dims");
  const std::vector<int64_t> strides = contiguous_strides(shape);
  const int64_t numel = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  json gate = up;
  gate["role"] = "in0";
  gate["node"] = attrs.at("gate");
  gate.erase("broadcast");
  up["role"] = "in1";
  up.erase("broadcast");
  std::string text = lowered.at("epilogue_expr").value("text", "");
  if (const auto at = text.find("acc"); at != std::string::npos) text.replace(at, 3, "gate");
  const std::string steps = steps_text(lowered.at("epilogue"));
  return {{"family", "pointwise"},
          {"rule", "gated_mlp_tail"},
          {"signature", "pointwise[" + steps + "]:" + attrs.value("dtype_out", "") + "->" + attrs.value("dtype_out", "")},
          {"operands", {gate, up}},
          {"output", lowered.value("output", "")},
          {"epilogue", lowered.at("epilogue")},
          {"epilogue_expr", {{"text", text}, {"ssa", ssa}}},
          {"problem", {{"numel", numel}, {"cols", shape.back()}}},
          {"attrs", {{"inputs", attrs.value("dtype_out", "")},
                     {"access", {"contiguous", "contiguous"}},
                     {"operand_strides", {strides, strides}},
                     {"dtype_out", attrs.value("dtype_out", "")},
                     {"shape", shape},
                     {"strides", strides}}}};
}

json gemm_epilogue_tail(const json& pattern, const std::vector<int64_t>& out_shape, const std::string& acc_dtype) {
  if (pattern.at("family") != "gemm") throw NotSupported("not a GEMM pattern");
  const auto& attrs = pattern.at("attrs");
  const json ssa_in = pattern.value("epilogue_expr", json::object()).value("ssa", json::array());
  if (pattern.value("epilogue", json::array()).empty() || ssa_in.size() < 2) {
    throw NotSupported("a GEMM without an epilogue has no tail");
  }
  if (out_shape.empty() || out_shape.size() > 8) throw NotSupported("the output's rank is not 1 to 8");
  auto type = [](const std::string& dtype, const std::vector<int64_t>& shape) {
    std::string t = dtype + "[";
    for (size_t d = 0; d < shape.size(); ++d) t += (d ? ", " : "") + std::to_string(shape[d]);
    return t + "]";
  };
  const int64_t n = out_shape.back();
  std::vector<int64_t> col_shape = out_shape;
  col_shape.back() = 1;
  // in0 is the product as the library GEMM writes it (the model's dtype, shaped as the output);
  // the epilogue operands follow, each reshaped by its kind (fact.compose.impls.GemmTailImpl
  // views them so): a row vector [n], a column [.., 1], a scalar [1], a full tensor as the output.
  json operands = json::array({{{"role", "in0"}, {"node", ""}, {"type", type(acc_dtype, out_shape)}}});
  json access = json::array({"contiguous"});
  json strides = json::array({contiguous_strides(out_shape)});
  for (const auto& o : pattern.at("operands")) {
    const std::string role = o.value("role", "");
    if (role == "a" || role == "b") continue;
    const std::string kind = o.value("broadcast", "");
    const std::string t = o.value("type", "");
    const std::string dtype = t.substr(0, t.find('['));
    std::vector<int64_t> shape;
    if (kind == "row") {
      shape = {n};
    } else if (kind == "col") {
      shape = col_shape;
    } else if (kind == "scalar") {
      shape = {1};
    } else if (kind == "full") {
      shape = out_shape;
    } else {
      throw NotSupported("an epilogue operand of kind '" + kind + "'");
    }
    operands.push_back({{"role", "in" + std::to_string(operands.size())}, {"node", o.value("node", "")}, {"type", type(dtype, shape)}});
    access.push_back(kind == "row" || kind == "full" ? "contiguous" : "broadcast");
    strides.push_back(contiguous_strides(shape));
  }
  if (operands.size() > 16) throw NotSupported("more than 16 inputs");
  const json ssa = ssa_over_inputs(ssa_in);
  const std::string steps = steps_text(pattern.at("epilogue"));
  const std::string dtype_out = attrs.value("dtype_out", "");
  json tail = {{"family", "pointwise"},
               {"rule", "gemm_epilogue_tail"},
               {"signature", "pointwise[" + steps + "]:" + acc_dtype + "->" + dtype_out},
               {"operands", operands},
               {"output", pattern.value("output", "")},
               {"epilogue", pattern.at("epilogue")},
               {"epilogue_expr", {{"ssa", ssa}}},
               {"problem", {{"numel", std::accumulate(out_shape.begin(), out_shape.end(), int64_t{1}, std::multiplies<>())},
                            {"cols", n}}},
               {"attrs", {{"inputs", acc_dtype},
                          {"access", access},
                          {"operand_strides", strides},
                          {"dtype_out", dtype_out},
                          {"shape", out_shape},
                          {"strides", contiguous_strides(out_shape)}}}};
  PointwiseSpec::from_pattern(tail);  // NotSupported unless every function has kernel code
  return tail;
}

namespace {

// The epilogue visitor tree's leaves after the accumulator, one per operand, with their
// arguments and null checks; an sm90 tree fetches a full operand through the collective's C,
// an sm80 tree through an aux load.
struct EvtLeaves {
  std::string types, args, checks, params = "T const& x0";
  std::string element_c = "void", c_pointer = "nullptr", c_ld = "0", c_batch = "0";  // sm90's C
};

EvtLeaves evt_leaves(const GemmSpec& spec, bool sm90) {
  EvtLeaves l;
  for (size_t i = 0; i < spec.operands.size(); ++i) {
    const auto& o = spec.operands[i];
    const std::string el = cutlass_element(o.dtype.empty() ? spec.dtype_out : o.dtype);
    const std::string idx = std::to_string(i);
    const std::string ptr = "static_cast<const " + el + "*>(p->operands[" + idx + "])";
    const std::string batch = "p->operand_batch_stride[" + idx + "]";
    l.params += ", T const& x" + std::to_string(i + 1);
    l.checks += "  if (!p->operands[" + idx + "]) return fail(FACT_INVALID_ARGS, \"epilogue operand " + idx + " (" + o.kind +
                ") is null\");\n";
    // The sm80 tree's row and aux loads read kAlignD elements at once (16 bytes of f32 output):
    // their pointers, leading dimensions and batch strides must keep those reads aligned.
    const std::string vector_checks =
        "  if (reinterpret_cast<uintptr_t>(p->operands[" + idx + "]) % (kAlignD * sizeof(" + el + ")) || (p->batch > 1 && " +
        batch + " % kAlignD)" + (o.kind == "full" ? " || p->operand_ld[" + idx + "] % kAlignD" : std::string()) +
        ") {\n    return fail(FACT_NOT_SUPPORTED, \"epilogue operand " + idx + " (" + o.kind + ") needs its pointer" +
        (o.kind == "full" ? ", leading dimension" : "") + " and batch stride aligned to the output's 16-byte vectors\");\n  }\n";
    if (o.kind == "row") {
      l.types += sm90 ? ",\n    Sm90RowBroadcast<0, TileShape, " + el + ", ElementCompute, Stride<_0, _1, int64_t>>"
                      : ",\n    VisitorRowBroadcast<OutputTileThreadMap, " + el + ", Stride<_0, _1, int64_t>>";
      l.args += ", {" + ptr + ", " + el + "(0), {_0{}, _1{}, " + batch + "}}";
      if (!sm90) l.checks += vector_checks;
    } else if (o.kind == "col") {
      l.types += sm90 ? ",\n    Sm90ColBroadcast<0, TileShape, " + el + ", ElementCompute, Stride<_1, _0, int64_t>>"
                      : ",\n    VisitorColBroadcast<OutputTileThreadMap, " + el + ", Stride<_1, _0, int64_t>>";
      l.args += ", {" + ptr + ", " + el + "(0), {_1{}, _0{}, " + batch + "}}";
    } else if (o.kind == "scalar") {
      l.types += sm90 ? ",\n    Sm90ScalarBroadcast<" + el + ">" : ",\n    VisitorScalarBroadcast<" + el + ">";
      l.args += ", {{" + el + "(0)}, {" + ptr + "}}";
    } else if (o.kind == "full" && sm90) {
      l.types += ",\n    Sm90SrcFetch<ElementC>";
      l.args += ", {}";
      l.element_c = el;
      l.c_pointer = "p->operands[" + idx + "]";
      l.c_ld = "p->operand_ld[" + idx + "]";
      l.c_batch = batch;
    } else if (o.kind == "full") {
      l.types += ",\n    VisitorAuxLoad<OutputTileThreadMap, " + el + ", Stride<int64_t, _1, int64_t>>";
      l.args += ", {const_cast<" + el + "*>(" + ptr + "), " + el + "(0), {p->operand_ld[" + idx + "], _1{}, " + batch +
                "}}";
      l.checks += vector_checks;
    } else {
      throw NotSupported("epilogue operand kind '" + o.kind + "'");
    }
  }
  return l;
}

std::string gemm_kernel_name(const GemmSpec& spec, const GemmConfig& c) {
  const std::string dt = spec.dtype_a == spec.dtype_out ? spec.dtype_a : spec.dtype_a + "to" + spec.dtype_out;
  return "fact_gemm_" + dt + "_" + spec.layout_a.substr(0, 1) + spec.layout_b.substr(0, 1) + "_" + spec.id() + "_" +
         c.name();
}

json gemm_kernel_info(const GemmSpec& spec, const GemmConfig& c) {
  json info = {{"family", spec.family},
               {"dtype_a", spec.dtype_a},
               {"dtype_b", spec.dtype_b},
               {"dtype_out", spec.dtype_out},
               {"layout_a", spec.layout_a},
               {"layout_b", spec.layout_b},
               {"epilogue", spec.epilogue_text},
               {"operands", json::array()},
               {"config", c.to_json()}};
  for (const auto& o : spec.operands) info["operands"].push_back({{"kind", o.kind}, {"dtype", o.dtype}});
  if (c.math != "default") info["math"] = c.math;
  return info;
}

MathFns math_fns(const GemmSpec& spec) {
  if (spec.dtype_out == "bf16" || spec.dtype_out == "f16") return {"cutlass::fast_tanh", "cutlass::fast_exp"};
  return {};
}

// What every GEMM template takes: the kernel's identity, types, layouts and tile, the visitor
// tree's leaves, and the shared fragments ${gemm_helpers} (error reporting, the epilogue
// functor) and ${gemm_abi} (the C ABI's entry points).
std::map<std::string, std::string> gemm_vars(const GemmSpec& spec, const GemmConfig& c, const EvtLeaves& leaves,
                                             const std::string& kernel_name) {
  const auto layout = [](const std::string& l) {
    return std::string(l == "row" ? "cutlass::layout::RowMajor" : "cutlass::layout::ColumnMajor");
  };
  return {
      {"fact_version", "0.1.0"},
      {"kernel_name", kernel_name},
      {"epilogue_text", spec.epilogue_text},
      {"element_a", cutlass_element(spec.dtype_a)},
      {"element_b", cutlass_element(spec.dtype_b)},
      {"element_d", cutlass_element(spec.dtype_out)},
      {"layout_a", layout(spec.layout_a)},
      {"layout_b", layout(spec.layout_b)},
      {"tile_m", std::to_string(c.tile_m)},
      {"tile_n", std::to_string(c.tile_n)},
      {"tile_k", std::to_string(c.tile_k)},
      {"evt_leaves", leaves.types},
      {"gemm_helpers", substitute(templates::kGemmHelpers,
                                  {{"functor_params", leaves.params},
                                   {"functor_body", functor_body(spec.ssa, spec.operands.size(), math_fns(spec))}})},
      {"gemm_abi",
       substitute(templates::kGemmAbi, {{"abi_exports", abi_exports(kernel_name, gemm_kernel_info(spec, c).dump())}})},
  };
}

// TF32 WGMMA kernels read K-major operands only: wrong results on the H200 otherwise (the
// candidate filter drops these configs and says why; this guards direct callers).
void require_tf32_k_major(const GemmSpec& spec) {
  if (spec.dtype_a == "f32" && (spec.layout_a != "row" || spec.layout_b != "col")) {
    throw NotSupported("f32 (tf32) GEMMs need K-major operands (row A, col B); got " + spec.layout_a + " A, " +
                       spec.layout_b + " B");
  }
}

// What both sm90 templates take besides gemm_vars(): the shared strides-and-grid fragment, the
// cluster, and the stage count (a fixed one, or as many as shared memory leaves the epilogue).
std::map<std::string, std::string> sm90_vars(const GemmConfig& c) {
  return {
      {"sm90_common", templates::kGemmSm90Common},
      {"tma_driver", templates::kTmaDriver},
      {"cluster_m", std::to_string(c.cluster_m)},
      {"cluster_n", std::to_string(c.cluster_n)},
      {"stage_count",
       c.stages > 0 ? "cutlass::gemm::collective::StageCount<" + std::to_string(c.stages) + ">"
                    : "cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(\n        sizeof(typename CollectiveEpilogue::SharedStorage))>"},
  };
}

}  // namespace

EmittedKernel emit_gemm(const GemmSpec& spec, const GemmConfig& c) {
  if (spec.family == "horizontal_gemm") return emit_gemm_grouped_sm90(spec, c);
  return c.kernel_schedule == "multistage" ? emit_gemm_sm80(spec, c) : emit_gemm_sm90(spec, c);
}

EmittedKernel emit_gemm_grouped_sm90(const GemmSpec& spec, const GemmConfig& c) {
  if (spec.family != "horizontal_gemm") throw NotSupported("a grouped GEMM kernel is for horizontal_gemm patterns");
  if (c.tile_scheduler != "group") {
    throw NotSupported("a horizontal GEMM runs CUTLASS's grouped kernel with the group tile scheduler, not " +
                       c.tile_scheduler);
  }
  if (c.math == "3xtf32") throw NotSupported("no grouped form of the 3xTF32 (fp32-accurate) GEMM");
  require_tf32_k_major(spec);
  if (spec.operands.size() > 1 || (spec.operands.size() == 1 && spec.operands[0].kind != "row")) {
    throw NotSupported("a horizontal GEMM's epilogue adds at most one bias row per part");
  }
  const bool bias = !spec.operands.empty();
  EvtLeaves leaves;
  std::string element_bias = cutlass_element(spec.dtype_out);
  if (bias) {
    element_bias = cutlass_element(spec.operands[0].dtype.empty() ? spec.dtype_out : spec.operands[0].dtype);
    leaves.types = ",\n    Sm90RowBroadcast<0, TileShape, ElementBias, ElementCompute, Stride<_0, _1, int64_t>>";
    leaves.params += ", T const& x1";
  }
  const bool coop = c.kernel_schedule == "cooperative";
  EmittedKernel k;
  k.name = gemm_kernel_name(spec, c);
  auto vars = gemm_vars(spec, c, leaves, k.name);
  vars.erase("gemm_abi");  // the grouped kernel's C ABI reads the parts: its own, in the template
  vars.merge(sm90_vars(c));
  vars.insert({
      {"element_bias", element_bias},
      {"has_bias", bias ? "true" : "false"},
      {"abi_exports", abi_exports(k.name, gemm_kernel_info(spec, c).dump())},
      {"kernel_schedule", coop ? "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative"
                               : "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong"},
      {"epilogue_schedule", coop ? "cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative"
                                 : "cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong"},
      {"fusion_arguments",
       bias ? "{{}, {reinterpret_cast<const ElementBias*>(ws + l.bias), ElementBias(0), {_0{}, _1{}, parts.max_n}}, {}}"
            : "{{}, {}}"},
  });
  k.source = substitute(templates::kGemmGroupedSm90, vars);
  return k;
}

EmittedKernel emit_gemm_sm80(const GemmSpec& spec, const GemmConfig& c) {
  if (c.kernel_schedule != "multistage") throw NotSupported("an sm80 GEMM needs the multistage schedule");
  if (spec.dtype_a != "f32" || c.math != "3xtf32") {
    throw NotSupported("sm80 GEMMs are emitted for f32 operands in 3xTF32 only (got " + spec.dtype_a + ", math " +
                       c.math + ")");
  }
  if (c.stages < 3) throw NotSupported("an sm80 multistage GEMM needs at least 3 stages");
  const auto [warps_m, warps_n] = multistage_warps(c);
  const EvtLeaves leaves = evt_leaves(spec, false);
  EmittedKernel k;
  k.name = gemm_kernel_name(spec, c);
  auto vars = gemm_vars(spec, c, leaves, k.name);
  vars.insert({
      {"math_text", "3xTF32 (each f32 operand split into a TF32 big and small part, three MMAs: fp32-accurate)"},
      {"math_operator", "cutlass::arch::OpMultiplyAddFastF32"},
      {"warps_m", std::to_string(warps_m)},
      {"warps_n", std::to_string(warps_n)},
      {"stages", std::to_string(c.stages)},
      {"fusion_arguments", leaves.args},
      {"operand_checks", leaves.checks},
  });
  k.source = substitute(templates::kGemmSm80, vars);
  return k;
}

EmittedKernel emit_gemm_sm90(const GemmSpec& spec, const GemmConfig& c) {
  if (c.kernel_schedule == "multistage") throw NotSupported("a multistage config is an sm80 kernel (emit_gemm_sm80)");
  if (c.math == "3xtf32") {
    throw NotSupported("3xTF32 (fp32-accurate) GEMMs are sm80 kernels in CUTLASS (no sm90 form): emit_gemm_sm80");
  }
  require_tf32_k_major(spec);
  const EvtLeaves leaves = evt_leaves(spec, true);
  EmittedKernel k;
  k.name = gemm_kernel_name(spec, c);
  std::string checks = leaves.checks;
  checks += "  if (p->reduction != 0 && p->reduction != 1) return fail(FACT_INVALID_ARGS, \"reduction knob must be 0 "
            "(deterministic) or 1 (nondeterministic)\");\n";
  checks += "  if (p->decomposition < 0 || p->decomposition > 2) return fail(FACT_INVALID_ARGS, \"decomposition knob must "
            "be 0 (heuristic), 1 (stream-K) or 2 (data-parallel)\");\n";
  if (c.tile_scheduler == "stream_k") {
    checks += "  if (p->decomposition != 0 && p->splits > 1) return fail(FACT_INVALID_ARGS, \"split-K (splits > 1) "
              "takes the heuristic decomposition\");\n";
  } else {
    checks += "  if (p->splits > 1) return fail(FACT_INVALID_ARGS, \"split-K needs a stream_k kernel\");\n";
    checks += "  if (p->reduction != 0) return fail(FACT_INVALID_ARGS, \"a nondeterministic reduction needs a stream_k "
              "kernel\");\n";
    checks += "  if (p->decomposition != 0) return fail(FACT_INVALID_ARGS, \"a decomposition other than the heuristic "
              "needs a stream_k kernel\");\n";
  }
  const bool coop = c.kernel_schedule == "cooperative";
  // CUTLASS's scalar broadcast node loads its scalar from global memory in its constructor, which
  // every warp runs at kernel entry, before the load warps wait for the predecessor: a kernel
  // with a scalar operand launches plainly.
  const bool scalar = std::any_of(spec.operands.begin(), spec.operands.end(),
                                  [](const auto& o) { return o.kind == "scalar"; });
  // A stream-K kernel launches plainly and is built without CUTLASS's grid dependency control
  // (the template says why).
  const bool stream_k = c.tile_scheduler == "stream_k";
  auto vars = gemm_vars(spec, c, leaves, k.name);
  vars.merge(sm90_vars(c));
  vars.insert({
      {"dependent_launch", scalar || stream_k ? "false" : "true"},
      {"gdc_define", stream_k ? "// (stream-K: no grid dependency control)" : "#define CUTLASS_ENABLE_GDC_FOR_SM90 1"},
      {"element_c", leaves.element_c},
      {"align_c", leaves.element_c == "void" ? "16 / sizeof(ElementD)" : "16 / sizeof(ElementC)"},
      {"kernel_schedule", coop ? "cutlass::gemm::KernelTmaWarpSpecializedCooperative"
                               : "cutlass::gemm::KernelTmaWarpSpecializedPingpong"},
      {"epilogue_schedule", c.epilogue_schedule == "tma_cooperative" ? "cutlass::epilogue::TmaWarpSpecializedCooperative"
                                                                     : "cutlass::epilogue::TmaWarpSpecialized"},
      {"tile_scheduler", c.tile_scheduler == "stream_k" ? "cutlass::gemm::StreamKScheduler"
                                                        : "cutlass::gemm::PersistentScheduler"},
      {"fusion_arguments", "{{}" + leaves.args + ", {}}"},
      {"c_pointer", leaves.c_pointer},
      {"c_ld", leaves.c_ld},
      {"c_batch_stride", leaves.c_batch},
      {"scheduler_splits", c.tile_scheduler == "stream_k"
                               ? "a.scheduler.splits = p->splits > 0 ? p->splits : 1;\n"
                                 "  using Reduction = decltype(a.scheduler.reduction_mode);\n"
                                 "  a.scheduler.reduction_mode = p->reduction == 1 ? Reduction::Nondeterministic\n"
                                 "                                                 : Reduction::Deterministic;\n"
                                 "  using Decomposition = decltype(a.scheduler.decomposition_mode);\n"
                                 "  a.scheduler.decomposition_mode = p->decomposition == 1 ? Decomposition::StreamK\n"
                                 "                                 : p->decomposition == 2 ? Decomposition::DataParallel\n"
                                 "                                                         : Decomposition::Heuristic;"
                               : "// persistent scheduler: no split-K, no reduction, no decomposition"},
      {"operand_checks", checks},
  });
  k.source = substitute(templates::kGemmSm90, vars);
  return k;
}

}  // namespace fact::realize
