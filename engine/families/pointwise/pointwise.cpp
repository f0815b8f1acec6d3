#include "families/pointwise/pointwise.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "ir/error.h"
#include "realize_templates.h"

namespace fact::realize {

using nlohmann::json;

namespace {

std::string cuda_type(const std::string& dtype) { return realize::cuda_type(dtype, "pointwise", true); }

// A float literal for CUDA C++ (NaN and infinities by name).
std::string literal(double v) {
  if (std::isnan(v)) return "NAN";
  if (std::isinf(v)) return v > 0 ? "INFINITY" : "(-INFINITY)";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(static_cast<float>(v)));
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return "(" + s + "f)";
}

// A JSON parameter: a number, or "inf" / "-inf" / "nan" as expr.cpp writes them.
double param(const json& e, size_t i, double dflt) {
  const auto ps = e.value("params", json::array());
  if (i >= ps.size() || ps[i].is_null()) return dflt;
  if (ps[i].is_number()) return ps[i].get<double>();
  const std::string s = ps[i].get<std::string>();
  return s == "inf" ? INFINITY : s == "-inf" ? -INFINITY : NAN;
}

// The C++ of one function of the expression vocabulary, on argument accessors `a`.
std::string call(const json& e, const std::vector<std::string>& a) {
  const std::string fn = e.at("op");
  static const std::map<std::string, std::string> infix = {{"add", "+"}, {"sub", "-"}, {"mul", "*"}, {"div", "/"}};
  static const std::map<std::string, std::string> compare = {{"eq", "=="}, {"ne", "!="}, {"lt", "<"},
                                                             {"le", "<="}, {"gt", ">"},  {"ge", ">="}};
  static const std::map<std::string, std::string> unary = {
      {"exp", "fact_exp"},       {"log", "logf"},           {"log1p", "log1pf"},       {"expm1", "expm1f"},         {"sqrt", "sqrtf"},         {"rsqrt", "rsqrtf"},
      {"abs", "fabsf"},          {"erf", "erff"},         {"sin", "sinf"},           {"cos", "cosf"},
      {"tanh", "fact_tanh"},     {"sigmoid", "fact_sigmoid"}, {"relu", "fact_relu"}, {"silu", "fact_silu"},
      {"gelu_erf", "fact_gelu_erf"}, {"gelu_tanh", "fact_gelu_tanh"}, {"mish", "fact_mish"},
      {"hardswish", "fact_hardswish"}, {"hardsigmoid", "fact_hardsigmoid"}};
  auto arity = [&](size_t n) {
    if (a.size() != n) throw NotSupported("'" + fn + "' with " + std::to_string(a.size()) + " arguments");
  };
  if (auto it = infix.find(fn); it != infix.end()) {
    arity(2);
    return "(" + a[0] + " " + it->second + " " + a[1] + ")";
  }
  if (auto it = compare.find(fn); it != compare.end()) {
    arity(2);
    return "(" + a[0] + " " + it->second + " " + a[1] + " ? 1.0f : 0.0f)";
  }
  if (auto it = unary.find(fn); it != unary.end()) {
    arity(1);
    return it->second + "(" + a[0] + ")";
  }
  if (fn == "minimum" || fn == "maximum") {
    arity(2);
    return "fact_" + fn + "(" + a[0] + ", " + a[1] + ")";
  }
  if (fn == "pow") {
    arity(2);
    // A small integer exponent as multiplies (within an ulp or two of powf, with the same special
    // values but for overflow past 1e19): powf is tens of instructions, and a written-out
    // GELU's x ** 3 would make its region compute-bound.
    const std::string x = a[0], y = a[1];
    if (y == literal(1)) return x;
    if (y == literal(2)) return "(" + x + " * " + x + ")";
    if (y == literal(3)) return "(" + x + " * " + x + " * " + x + ")";
    if (y == literal(4)) return "((" + x + " * " + x + ") * (" + x + " * " + x + "))";
    if (y == literal(-1)) return "(1.0f / " + x + ")";
    if (y == literal(-2)) return "(1.0f / (" + x + " * " + x + "))";
    return "powf(" + x + ", " + y + ")";
  }
  if (fn == "where") {
    arity(3);
    return "(" + a[0] + " != 0.0f ? " + a[1] + " : " + a[2] + ")";
  }
  arity(1);
  const std::string x = a[0];
  if (fn == "logical_not") return "(" + x + " == 0.0f ? 1.0f : 0.0f)";
  if (fn == "neg") return "(-" + x + ")";
  if (fn == "reciprocal") return "(1.0f / " + x + ")";
  if (fn == "square") return "(" + x + " * " + x + ")";
  if (fn == "leaky_relu") return "fact_leaky_relu(" + x + ", " + literal(param(e, 0, 0.01)) + ")";
  if (fn == "hardtanh") {
    return "fact_clamp(" + x + ", " + literal(param(e, 0, -1)) + ", " + literal(param(e, 1, 1)) + ")";
  }
  if (fn == "clamp") {
    return "fact_clamp(" + x + ", " + literal(param(e, 0, -INFINITY)) + ", " + literal(param(e, 1, INFINITY)) + ")";
  }
  if (fn == "softplus") {
    return "fact_softplus(" + x + ", " + literal(param(e, 0, 1)) + ", " + literal(param(e, 1, 20)) + ")";
  }
  if (fn == "elu") {
    return "fact_elu(" + x + ", " + literal(param(e, 0, 1)) + ", " + literal(param(e, 1, 1)) + ", " +
           literal(param(e, 2, 1)) + ")";
  }
  if (fn == "cast") {
    const std::string to = e.value("dtype", "f32");
    if (to == "f32" || to == "f64") return x;
    if (to == "bool") return "(" + x + " != 0.0f ? 1.0f : 0.0f)";
    return "round_to<" + cuda_type(to) + ">(" + x + ")";
  }
  throw NotSupported("'" + fn + "' has no pointwise kernel code");
}

// Writes the kernel body: values are float[kVec] arrays (or scalars, for constants), emitted
// on first use at a last-dim offset; a concatenation's branches get their own scopes.
class BodyWriter {
 public:
  BodyWriter(const json& ssa, const std::vector<std::string>& access) : ssa_(ssa), access_(access) {}

  std::string body(int root) {
    scopes_.emplace_back();
    // Loads first: every operand read outside a concatenation's branches, so that they are
    // all in flight before the math (which may branch) starts.
    hoist(root, 0);
    const Value r = emit(root, 0);
    line("Pack<TOut> o;");
    line("#pragma unroll");
    line("for (int j = 0; j < kVec; ++j) o.v[j] = from_float<TOut>(" + r.at("j") + ");");
    line("reinterpret_cast<Pack<TOut>*>(out)[v] = o;");
    return os_.str();
  }

 private:
  struct Value {
    std::string name;
    bool scalar = false;
    std::string at(const std::string& j) const { return scalar ? name : name + "[" + j + "]"; }
  };

  void line(const std::string& s) {
    const bool pragma = s.rfind("#", 0) == 0;
    os_ << (pragma ? "" : std::string(static_cast<size_t>(2 * indent_), ' ')) << s << "\n";
  }
  static std::string col(int64_t off) {
    return off == 0 ? "c" : off > 0 ? "c + " + std::to_string(off) : "c - " + std::to_string(-off);
  }
  std::string fresh() { return "v" + std::to_string(next_++); }

  const Value* find(int id, int64_t off) const {
    for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s) {
      auto it = s->find({id, off});
      if (it != s->end()) return &it->second;
    }
    return nullptr;
  }

  void hoist(int id, int64_t off) {
    if (!hoisted_.insert({id, off}).second) return;  // a shared sub-expression: once
    const json& e = ssa_.at(static_cast<size_t>(id));
    const std::string op = e.at("op");
    if (op == "operand") {
      emit(id, off);
    } else if (op == "slice_last") {
      hoist(e.at("args").at(0), off + static_cast<int64_t>(param(e, 0, 0)));
    } else if (op != "cat_last" && op != "constant") {
      for (const auto& a : e.value("args", json::array())) hoist(a, off);
    }
  }

  Value emit(int id, int64_t off) {
    if (const Value* v = find(id, off)) return *v;
    const json& e = ssa_.at(static_cast<size_t>(id));
    const std::string op = e.at("op");
    Value out;
    if (op == "constant") {
      out = {literal(param(json{{"params", json::array({e.at("value")})}}, 0, 0)), true};
      return out;  // inline, never stored
    }
    if (op == "acc") throw NotSupported("a pointwise expression has no accumulator");
    if (op == "slice_last") return emit(e.at("args").at(0), off + static_cast<int64_t>(param(e, 0, 0)));
    if (op == "operand") {
      const int k = e.at("index");
      const std::string in = "in" + std::to_string(k), base = "base[" + std::to_string(k) + "]";
      const std::string how = static_cast<size_t>(k) < access_.size() ? access_[static_cast<size_t>(k)] : "strided";
      out.name = fresh();
      line("float " + out.name + "[kVec];");
      if (how == "contiguous") {
        line("load_contiguous(" + in + ", " + base + " + " + col(off) + ", " + out.name + ");");
      } else if (how == "broadcast") {
        line("load_broadcast(" + in + ", " + base + ", " + out.name + ");");
      } else {
        line("load(" + in + ", " + base + ", " + col(off) + ", a.strides[" + std::to_string(k) + "][a.rank - 1], " +
             out.name + ");");
      }
    } else if (op == "cat_last") {
      out.name = fresh();
      line("float " + out.name + "[kVec];");
      const auto args = e.at("args");
      int64_t start = 0;
      for (size_t i = 0; i < args.size(); ++i) {
        const int64_t size = static_cast<int64_t>(param(e, i, 0));
        const bool last = i + 1 == args.size();
        const std::string head = i == 0 ? "if" : "} else if";
        line(last ? (i == 0 ? "{" : "} else {") : head + " (" + col(off) + " < " + std::to_string(start + size) + ") {");
        ++indent_;
        scopes_.emplace_back();
        const Value part = emit(args[i], off - start);
        line("#pragma unroll");
        line("for (int j = 0; j < kVec; ++j) " + out.name + "[j] = " + part.at("j") + ";");
        scopes_.pop_back();
        --indent_;
        start += size;
      }
      line("}");
    } else {
      std::vector<Value> args;
      for (const auto& a : e.at("args")) args.push_back(emit(a, off));
      const bool scalar = std::all_of(args.begin(), args.end(), [](const Value& v) { return v.scalar; });
      std::vector<std::string> at;
      for (const auto& v : args) at.push_back(v.at("j"));
      const std::string code = call(e, at);
      out.name = fresh();
      if (scalar) {
        out.scalar = true;
        line("const float " + out.name + " = " + code + ";");
      } else {
        line("float " + out.name + "[kVec];");
        line("#pragma unroll");
        line("for (int j = 0; j < kVec; ++j) " + out.name + "[j] = " + code + ";");
      }
    }
    scopes_.back()[{id, off}] = out;
    return out;
  }

  const json& ssa_;
  const std::vector<std::string>& access_;
  std::ostringstream os_;
  int indent_ = 2;  // inside the kernel's per-vector lambda
  int next_ = 0;
  std::vector<std::map<std::pair<int, int64_t>, Value>> scopes_;
  std::set<std::pair<int, int64_t>> hoisted_;
};

// The access kinds as a C++ initializer: 0 strided, 1 contiguous, 2 broadcast.
std::string access_list(const std::vector<std::string>& access) {
  std::string out;
  for (const auto& k : access) out += std::string(out.empty() ? "" : ", ") + (k == "contiguous" ? "1" : k == "broadcast" ? "2" : "0");
  return out.empty() ? "0" : out;
}

std::string input_bytes(const std::vector<std::string>& inputs) {
  std::string out;
  for (const auto& d : inputs) out += std::string(out.empty() ? "" : ", ") + std::to_string(dtype_size(d));
  return out.empty() ? "1" : out;
}

// The expression for the kernel's comment, over in0, in1, ... (never the graph's names: they
// are the user's text, and renaming a node must not change the kernel).
std::string ssa_text(const json& ssa) {
  std::vector<std::string> text;
  for (const auto& e : ssa) {
    const std::string op = e.at("op");
    const bool word = !op.empty() && std::all_of(op.begin(), op.end(), [](char ch) {
      return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_';
    });
    std::vector<std::string> args;
    for (const auto& a : e.value("args", json::array())) {
      const auto i = a.get<size_t>();
      args.push_back(i < text.size() ? text[i] : "?");
    }
    static const std::map<std::string, std::string> infix = {{"add", " + "}, {"sub", " - "}, {"mul", " * "}, {"div", " / "}};
    if (op == "operand") {
      text.push_back("in" + std::to_string(e.at("index").get<int>()));
    } else if (op == "constant") {
      text.push_back(literal(param(json{{"params", json::array({e.at("value")})}}, 0, 0)));
    } else if (infix.count(op) && args.size() == 2) {
      text.push_back("(" + args[0] + infix.at(op) + args[1] + ")");
    } else {
      std::string s = (word ? op : std::string("?")) + "(";
      for (size_t i = 0; i < args.size(); ++i) s += (i ? ", " : "") + args[i];
      const auto params = e.value("params", json::array());
      for (size_t i = 0; i < params.size(); ++i) {
        s += (args.empty() && i == 0 ? "" : ", ") + literal(param(e, i, 0));
      }
      text.push_back(s + ")");
    }
    if (text.back().size() > 2000) text.back() = "...";  // a comment, not the kernel
  }
  return text.empty() ? "" : text.back();
}

}  // namespace

PointwiseSpec PointwiseSpec::from_pattern(const json& p) {
  if (p.at("family") != "pointwise") throw NotSupported("not a pointwise pattern");
  PointwiseSpec s;
  s.ssa = p.at("epilogue_expr").at("ssa");
  check_expression_size(s.ssa);
  for (const auto& o : p.at("operands")) {
    const std::string type = o.value("type", "");
    s.inputs.push_back(type.substr(0, type.find('[')));
    cuda_type(s.inputs.back());
  }
  if (s.inputs.size() > 16) throw NotSupported("more than 16 inputs");
  const auto& a = p.at("attrs");
  s.access = a.value("access", std::vector<std::string>(s.inputs.size(), "strided"));
  if (s.access.size() != s.inputs.size()) throw NotSupported("an access kind per input expected");
  for (const auto& k : s.access) {
    if (k != "contiguous" && k != "broadcast" && k != "strided") throw NotSupported("input access '" + k + "'");
  }
  s.dtype_out = a.at("dtype_out");
  if (s.dtype_out == "bool") throw NotSupported("a boolean output");
  cuda_type(s.dtype_out);
  s.rank = static_cast<int>(a.at("shape").size());
  if (s.rank < 1 || s.rank > 8) throw NotSupported("rank " + std::to_string(s.rank) + " (1 to 8 supported)");
  s.cols = p.at("problem").at("cols").get<int64_t>();
  if (s.cols <= 0) throw NotSupported("an empty last dim");
  if (s.ssa.empty()) throw NotSupported("an empty expression");
  // 16 bytes of output per thread, narrowed until it divides the last dim and every slice
  // start and concatenation boundary (so no vector straddles one).
  int64_t vec = 16 / dtype_size(s.dtype_out);
  vec = std::gcd(vec, s.cols);
  for (const auto& e : s.ssa) {
    const std::string op = e.at("op");
    if (op == "operand" && (e.at("index").get<int>() < 0 || e.at("index").get<size_t>() >= s.inputs.size())) {
      throw NotSupported("an operand index out of range");
    }
    if (op == "slice_last" || op == "cat_last") {
      for (size_t i = 0; i < e.value("params", json::array()).size(); ++i) {
        vec = std::gcd(vec, static_cast<int64_t>(param(e, i, 0)));
      }
    }
  }
  s.vec = static_cast<int>(std::max<int64_t>(vec, 1));
  // A contiguous operand is read as aligned vectors: its rows (as traced, and as a contiguous
  // copy would have them) must start on vector boundaries; otherwise it is read strided.
  const auto strides = a.value("operand_strides", json::array());
  const auto& operands = p.at("operands");
  for (size_t i = 0; i < s.access.size(); ++i) {
    if (s.access[i] != "contiguous") continue;
    const auto shape = type_shape(operands[i].value("type", ""));
    bool rows_fit = !shape.empty() && shape.back() % s.vec == 0;
    if (i < strides.size() && strides[i].size() == shape.size()) {
      for (size_t d = 0; d + 1 < shape.size(); ++d) {
        rows_fit = rows_fit && (shape[d] == 1 || strides[i][d].get<int64_t>() % s.vec == 0);
      }
    }
    if (!rows_fit) s.access[i] = "strided";
  }
  // Every function must have kernel code: emit once to find out.
  BodyWriter(s.ssa, s.access).body(static_cast<int>(s.ssa.size()) - 1);
  return s;
}

std::string PointwiseSpec::id() const {
  return short_hash(json({ssa, inputs, access, dtype_out, cols, rank, vec}).dump());
}

// Several vectors a thread keep more loads in flight and spread the index arithmetic; a block of
// 128 x 4 and one of 256 x 2 cover the same 1024 vectors with different occupancy.
std::vector<PointwiseConfig> pointwise_configs(const PointwiseSpec&) { return {{128, 4}, {256, 2}, {256, 4}}; }

// A GEMM's epilogue as a pass of its own is one candidate among the GEMM's: one block shape.
std::vector<PointwiseConfig> tail_configs(const PointwiseSpec&) { return {{256, 2}}; }

EmittedKernel emit_pointwise(const PointwiseSpec& spec, const PointwiseConfig& c) {
  FACT_CHECK(c.threads % 32 == 0 && c.threads <= 1024 && c.threads > 0 && c.items >= 1 && c.items <= 16,
             "bad pointwise config " + c.name());
  EmittedKernel k;
  k.name = "fact_pointwise_" + spec.dtype_out + "_" + spec.id() + "_" + c.name();
  const json info = {{"family", "pointwise"}, {"inputs", spec.inputs}, {"access", spec.access}, {"dtype_out", spec.dtype_out},
                     {"cols", spec.cols},     {"rank", spec.rank},     {"vec", spec.vec},
                     {"expression", ssa_text(spec.ssa)}, {"config", c.to_json()}};
  std::string decls = "  TOut* __restrict__ out = a.out;";
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    decls += "\n  const auto* __restrict__ in" + std::to_string(i) + " = static_cast<const " +
             cuda_type(spec.inputs[i]) + "*>(a.inputs[" + std::to_string(i) + "]);";
  }
  const std::string text = ssa_text(spec.ssa);
  std::map<std::string, std::string> vars = {
      {"description", "pointwise region, " + std::to_string(spec.inputs.size()) + " input(s) -> " + spec.dtype_out},
      {"kernel_name", k.name},
      {"abi_exports", abi_exports(k.name, info.dump())},
      {"launch", templates::kLaunch},
      {"expression", text},
      {"t_out", cuda_type(spec.dtype_out)},
      {"cols", std::to_string(spec.cols)},
      {"vec", std::to_string(spec.vec)},
      {"inputs", std::to_string(spec.inputs.size())},
      {"threads", std::to_string(c.threads)},
      {"items", std::to_string(c.items)},
      {"inputs_decl", decls},
      {"body", BodyWriter(spec.ssa, spec.access).body(static_cast<int>(spec.ssa.size()) - 1)},
      {"access", access_list(spec.access)},
      {"input_bytes", input_bytes(spec.inputs)},
      {"fast_math", spec.dtype_out == "bf16" || spec.dtype_out == "f16" ? "true" : "false"},
  };
  k.source = substitute(templates::kPointwise, vars);
  return k;
}

const char* pointwise_abi_header_text() { return templates::kPointwiseAbiHeader; }

}  // namespace fact::realize
