#include "discover/expr.h"

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include "discover/views.h"
#include "ir/error.h"

namespace fact::discover {
namespace {

using Params = std::vector<double>;
using Fn = std::function<double(const std::vector<double>&, const Params&)>;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double softplus(double x, double beta = 1.0, double threshold = 20.0) {
  return beta * x > threshold ? x : std::log1p(std::exp(beta * x)) / beta;
}
double gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}
double p(const Params& ps, size_t i, double dflt) { return i < ps.size() ? ps[i] : dflt; }

struct FnInfo {
  int arity;
  Fn f;
};

// Every function an epilogue may contain; stage 2 maps each to an epilogue visitor node.
const std::map<std::string, FnInfo>& functions() {
  using V = std::vector<double>;
  static const std::map<std::string, FnInfo> table = {
      {"add", {2, [](const V& a, const Params&) { return a[0] + a[1]; }}},
      {"sub", {2, [](const V& a, const Params&) { return a[0] - a[1]; }}},
      {"mul", {2, [](const V& a, const Params&) { return a[0] * a[1]; }}},
      {"div", {2, [](const V& a, const Params&) { return a[0] / a[1]; }}},
      {"minimum", {2, [](const V& a, const Params&) { return std::min(a[0], a[1]); }}},
      {"maximum", {2, [](const V& a, const Params&) { return std::max(a[0], a[1]); }}},
      {"pow", {2, [](const V& a, const Params&) { return std::pow(a[0], a[1]); }}},
      {"where", {3, [](const V& a, const Params&) { return a[0] != 0 ? a[1] : a[2]; }}},
      {"eq", {2, [](const V& a, const Params&) { return a[0] == a[1] ? 1.0 : 0.0; }}},
      {"ne", {2, [](const V& a, const Params&) { return a[0] != a[1] ? 1.0 : 0.0; }}},
      {"lt", {2, [](const V& a, const Params&) { return a[0] < a[1] ? 1.0 : 0.0; }}},
      {"le", {2, [](const V& a, const Params&) { return a[0] <= a[1] ? 1.0 : 0.0; }}},
      {"gt", {2, [](const V& a, const Params&) { return a[0] > a[1] ? 1.0 : 0.0; }}},
      {"ge", {2, [](const V& a, const Params&) { return a[0] >= a[1] ? 1.0 : 0.0; }}},
      {"logical_not", {1, [](const V& a, const Params&) { return a[0] == 0 ? 1.0 : 0.0; }}},
      {"neg", {1, [](const V& a, const Params&) { return -a[0]; }}},
      {"exp", {1, [](const V& a, const Params&) { return std::exp(a[0]); }}},
      {"log", {1, [](const V& a, const Params&) { return std::log(a[0]); }}},
      {"log1p", {1, [](const V& a, const Params&) { return std::log1p(a[0]); }}},
      {"expm1", {1, [](const V& a, const Params&) { return std::expm1(a[0]); }}},
      {"sqrt", {1, [](const V& a, const Params&) { return std::sqrt(a[0]); }}},
      {"rsqrt", {1, [](const V& a, const Params&) { return 1.0 / std::sqrt(a[0]); }}},
      {"reciprocal", {1, [](const V& a, const Params&) { return 1.0 / a[0]; }}},
      {"abs", {1, [](const V& a, const Params&) { return std::fabs(a[0]); }}},
      {"square", {1, [](const V& a, const Params&) { return a[0] * a[0]; }}},
      {"erf", {1, [](const V& a, const Params&) { return std::erf(a[0]); }}},
      {"sin", {1, [](const V& a, const Params&) { return std::sin(a[0]); }}},
      {"cos", {1, [](const V& a, const Params&) { return std::cos(a[0]); }}},
      {"tanh", {1, [](const V& a, const Params&) { return std::tanh(a[0]); }}},
      {"sigmoid", {1, [](const V& a, const Params&) { return sigmoid(a[0]); }}},
      {"relu", {1, [](const V& a, const Params&) { return std::max(a[0], 0.0); }}},
      {"silu", {1, [](const V& a, const Params&) { return a[0] * sigmoid(a[0]); }}},
      {"gelu_erf", {1, [](const V& a, const Params&) { return gelu_erf(a[0]); }}},
      {"gelu_tanh", {1, [](const V& a, const Params&) { return gelu_tanh(a[0]); }}},
      {"mish", {1, [](const V& a, const Params&) { return a[0] * std::tanh(softplus(a[0])); }}},
      {"hardswish",
       {1, [](const V& a, const Params&) { return a[0] * std::clamp(a[0] + 3, 0.0, 6.0) / 6; }}},
      {"hardsigmoid",
       {1, [](const V& a, const Params&) { return std::clamp(a[0] + 3, 0.0, 6.0) / 6; }}},
      // leaky_relu: params [slope]
      {"leaky_relu",
       {1, [](const V& a, const Params& ps) { return a[0] >= 0 ? a[0] : a[0] * p(ps, 0, 0.01); }}},
      // hardtanh and clamp: params [min, max]
      {"hardtanh",
       {1, [](const V& a, const Params& ps) { return std::clamp(a[0], p(ps, 0, -1), p(ps, 1, 1)); }}},
      {"clamp",
       {1, [](const V& a, const Params& ps) {
          return std::min(std::max(a[0], p(ps, 0, -INFINITY)), p(ps, 1, INFINITY));
        }}},
      // softplus: params [beta, threshold]
      {"softplus",
       {1, [](const V& a, const Params& ps) { return softplus(a[0], p(ps, 0, 1), p(ps, 1, 20)); }}},
      // elu: params [alpha, scale, input_scale]
      {"elu",
       {1, [](const V& a, const Params& ps) {
          const double x = a[0];
          return p(ps, 1, 1) * (x > 0 ? x : p(ps, 0, 1) * (std::exp(x * p(ps, 2, 1)) - 1));
        }}},
      {"cast", {1, [](const V& a, const Params&) { return a[0]; }}},
  };
  return table;
}

// Activations recognised by value, whatever ops spell them.
const std::vector<std::string>& fingerprint_candidates() {
  static const std::vector<std::string> names = {"gelu_tanh", "gelu_erf", "silu",      "mish",
                                                 "sigmoid",   "tanh",     "relu",      "softplus",
                                                 "hardswish", "hardsigmoid", "elu"};
  return names;
}

constexpr double kSamples[] = {-6.0, -3.1, -1.7, -1.0, -0.55, -0.1, 0.0,
                               0.05, 0.3,  0.9,  1.4,  2.5,   5.0};

}  // namespace

int ExprGraph::add(Expr e) {
  exprs.push_back(std::move(e));
  return static_cast<int>(exprs.size()) - 1;
}

void ExprGraph::compact() {
  if (root < 0) return;
  std::vector<char> live(exprs.size(), 0);
  live[static_cast<size_t>(root)] = 1;
  for (int i = root; i >= 0; --i) {
    if (!live[static_cast<size_t>(i)]) continue;
    for (int a : exprs[static_cast<size_t>(i)].args) live[static_cast<size_t>(a)] = 1;
  }
  std::vector<int> remap(exprs.size(), -1);
  std::vector<Expr> kept;
  for (size_t i = 0; i < exprs.size(); ++i) {
    if (!live[i]) continue;
    Expr e = exprs[i];
    for (int& a : e.args) a = remap[static_cast<size_t>(a)];
    remap[i] = static_cast<int>(kept.size());
    kept.push_back(std::move(e));
  }
  root = remap[static_cast<size_t>(root)];
  exprs = std::move(kept);
}

bool known_function(const std::string& fn) { return functions().count(fn) != 0; }

int function_arity(const std::string& fn) {
  const auto it = functions().find(fn);
  return it == functions().end() ? -1 : it->second.arity;
}

double eval_function(const std::string& fn, const std::vector<double>& args, const Params& params) {
  const auto& table = functions();
  auto it = table.find(fn);
  FACT_CHECK(it != table.end(), "unknown epilogue function " + fn);
  return it->second.f(args, params);
}

std::optional<double> eval_unary(const ExprGraph& g, int input, int output, double x) {
  std::vector<std::optional<double>> val(g.exprs.size());
  val[static_cast<size_t>(input)] = x;
  for (int i = 0; i <= output; ++i) {
    if (i == input) continue;
    const auto& e = g.exprs[static_cast<size_t>(i)];
    if (e.kind == Expr::Kind::constant) {
      val[static_cast<size_t>(i)] = e.value;
    } else if (e.kind == Expr::Kind::fn) {
      std::vector<double> args;
      bool ok = true;
      for (int a : e.args) {
        if (!val[static_cast<size_t>(a)]) {
          ok = false;
          break;
        }
        args.push_back(*val[static_cast<size_t>(a)]);
      }
      if (ok) val[static_cast<size_t>(i)] = eval_function(e.fn, args, e.params);
    }
  }
  return val[static_cast<size_t>(output)];
}

std::string fingerprint_activation(const ExprGraph& g, int input, int output) {
  std::vector<double> ys;
  for (double x : kSamples) {
    auto y = eval_unary(g, input, output, x);
    if (!y) return "";
    ys.push_back(*y);
  }
  for (const auto& name : fingerprint_candidates()) {
    bool same = true;
    for (size_t i = 0; i < ys.size() && same; ++i) {
      const double want = eval_function(name, {kSamples[i]}, {});
      same = std::fabs(ys[i] - want) <= 1e-6 * (1.0 + std::fabs(want));
    }
    if (same) return name;
  }
  return "";
}

nlohmann::json ExprGraph::to_json() const {
  auto out = nlohmann::json::array();
  for (size_t i = 0; i < exprs.size(); ++i) {
    const auto& e = exprs[i];
    nlohmann::json j = {{"id", i}};
    switch (e.kind) {
      case Expr::Kind::acc: j["op"] = "acc"; break;
      case Expr::Kind::operand: j["op"] = "operand"; j["index"] = e.operand; break;
      case Expr::Kind::constant:
        j["op"] = "constant";
        if (std::isfinite(e.value)) {
          j["value"] = e.value;
        } else {
          j["value"] = std::isnan(e.value) ? "nan" : (e.value > 0 ? "inf" : "-inf");
        }
        break;
      case Expr::Kind::fn:
        j["op"] = e.fn;
        j["args"] = e.args;
        if (!e.params.empty()) {
          // JSON has no infinity: non-finite params are spelt as strings, like constants.
          auto params = nlohmann::json::array();
          for (double v : e.params) {
            params.push_back(std::isfinite(v) ? nlohmann::json(v)
                                              : nlohmann::json(std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf"));
          }
          j["params"] = params;
        }
        if (!e.dtype.empty()) j["dtype"] = e.dtype;
        break;
    }
    out.push_back(j);
  }
  return out;
}

ExprGraph ExprGraph::from_json(const nlohmann::json& ssa) {
  ExprGraph g;
  auto number = [](const nlohmann::json& v) -> double {
    if (v.is_number()) return v.get<double>();
    const auto s = v.get<std::string>();
    return s == "inf" ? INFINITY : s == "-inf" ? -INFINITY : NAN;
  };
  for (const auto& j : ssa) {
    Expr e;
    const std::string op = j.at("op");
    if (op == "acc") {
      e.kind = Expr::Kind::acc;
    } else if (op == "operand") {
      e.kind = Expr::Kind::operand;
      e.operand = j.at("index");
    } else if (op == "constant") {
      e.kind = Expr::Kind::constant;
      e.value = number(j.at("value"));
    } else {
      e.fn = op;
      e.args = j.at("args").get<std::vector<int>>();
      for (const auto& v : j.value("params", nlohmann::json::array())) e.params.push_back(number(v));
      e.dtype = j.value("dtype", std::string());
    }
    g.root = g.add(e);
  }
  return g;
}

namespace {
std::string bare(std::string s) {
  if (s.size() > 2 && s.front() == '(' && s.back() == ')') s = s.substr(1, s.size() - 2);
  return s;
}
}  // namespace

std::string ExprGraph::to_text(const std::vector<std::string>& operand_names) const {
  if (root < 0) return "acc";
  // One pass in order (an Expr's arguments come before it), no recursion: a region of 12,000
  // chained ops must not overflow the stack. A shared sub-expression is written out at each
  // use, so the text is capped: it names the expression for people, nothing parses it.
  constexpr size_t kMaxText = 4096;
  static const std::map<std::string, std::string> infix = {{"add", " + "}, {"sub", " - "}, {"mul", " * "}, {"div", " / "}};
  std::vector<std::string> text(exprs.size());
  auto arg = [&](int a) -> const std::string& {
    static const std::string unknown = "?";
    return a >= 0 && static_cast<size_t>(a) < text.size() ? text[static_cast<size_t>(a)] : unknown;
  };
  for (size_t i = 0; i < exprs.size() && i <= static_cast<size_t>(root); ++i) {
    const auto& e = exprs[i];
    std::ostringstream os;
    switch (e.kind) {
      case Expr::Kind::acc: os << "acc"; break;
      case Expr::Kind::operand:
        os << (static_cast<size_t>(e.operand) < operand_names.size() ? operand_names[static_cast<size_t>(e.operand)]
                                                                      : "operand" + std::to_string(e.operand));
        break;
      case Expr::Kind::constant: os << e.value; break;
      case Expr::Kind::fn: {
        auto it = infix.find(e.fn);
        if (it != infix.end() && e.args.size() == 2) {
          os << "(" << arg(e.args[0]) << it->second << arg(e.args[1]) << ")";
          break;
        }
        os << (e.fn == "cast" ? "to_" + e.dtype : e.fn) << "(";
        for (size_t k = 0; k < e.args.size(); ++k) os << (k ? ", " : "") << bare(arg(e.args[k]));
        for (double prm : e.params) os << ", " << prm;
        os << ")";
        break;
      }
    }
    text[i] = os.str();
    if (text[i].size() > kMaxText) text[i] = text[i].substr(0, kMaxText) + "...";
  }
  return bare(arg(root));
}

bool node_to_expr(const ir::Graph& g, const ir::Node& n, const std::function<int(int)>& expr_of,
                  ExprGraph& out, int& result, std::string& why) {
  using ir::Arg;
  using ir::Op;
  bool ok = true;
  // The value of positional/keyword argument `pos`: a tensor's Expr, or a new constant.
  auto value = [&](int pos, const std::string& key, double dflt, bool& ok) -> int {
    const Arg* a = n.arg(pos, key);
    if (a && a->is_node()) return expr_of(a->node);
    double v = dflt;
    if (a && a->kind != Arg::Kind::none && !scalar_value(g, *a, v)) {
      ok = false;
      return -1;
    }
    Expr c;
    c.kind = Expr::Kind::constant;
    c.value = v;
    return out.add(c);
  };
  // A numeric parameter; a tensor parameter without a known value is not a constant, and
  // silently using the default would change the function.
  auto param = [&](int pos, const std::string& key, double dflt) {
    const Arg* a = n.arg(pos, key);
    double v = dflt;
    if (a && a->kind != Arg::Kind::none && !scalar_value(g, *a, v)) ok = false;
    return v;
  };
  auto is_tensor = [&](int pos, const std::string& key) {
    const Arg* a = n.arg(pos, key);
    return a && a->is_node();
  };
  auto fn = [&](const std::string& name, std::vector<int> args, Params params = {}) {
    Expr e;
    e.kind = Expr::Kind::fn;
    e.fn = name;
    e.args = std::move(args);
    e.params = std::move(params);
    e.nodes = {n.id};
    return out.add(e);
  };
  const std::string name(ir::op_name(n.op));
  switch (n.op) {
    case Op::add:
    case Op::sub:
    case Op::rsub: {
      int a = value(0, "self", 0, ok);
      int b = value(1, "other", 0, ok);
      const double alpha = param(2, "alpha", 1.0);
      if (!ok) break;
      // add/sub: self (+|-) alpha * other;  rsub: other - alpha * self.
      int& scaled = n.op == Op::rsub ? a : b;
      if (alpha != 1.0) {
        Expr c;
        c.kind = Expr::Kind::constant;
        c.value = alpha;
        scaled = fn("mul", {scaled, out.add(c)});
      }
      result = n.op == Op::add ? fn("add", {a, b}) : n.op == Op::sub ? fn("sub", {a, b}) : fn("sub", {b, a});
      return true;
    }
    case Op::mul:
    case Op::div:
    case Op::minimum:
    case Op::maximum:
    case Op::eq:
    case Op::ne:
    case Op::lt:
    case Op::le:
    case Op::gt:
    case Op::ge: {
      if (n.op == Op::div) {
        const Arg* mode = n.arg(-1, "rounding_mode");
        if (mode && mode->kind == Arg::Kind::string) {
          why = "div with rounding_mode='" + mode->s + "' is not an epilogue function";
          return false;
        }
      }
      int a = value(0, "self", 0, ok);
      int b = value(1, "other", 0, ok);
      if (!ok) break;
      result = fn(name, {a, b});
      return true;
    }
    case Op::pow: {
      int a = value(0, "self", 0, ok);
      int b = value(1, "exponent", 1, ok);
      if (!ok) break;
      result = fn("pow", {a, b});
      return true;
    }
    case Op::where: {
      int c = value(0, "condition", 0, ok);
      int a = value(1, "self", 0, ok);
      int b = value(2, "other", 0, ok);
      if (!ok) break;
      result = fn("where", {c, a, b});
      return true;
    }
    case Op::masked_fill: {
      int x = value(0, "self", 0, ok);
      int mask = value(1, "mask", 0, ok);
      int v = value(2, "value", 0, ok);
      if (!ok) break;
      result = fn("where", {mask, v, x});
      return true;
    }
    case Op::gelu: {
      const Arg* approx = n.arg(1, "approximate");
      const bool tanh = approx && approx->kind == Arg::Kind::string && approx->s == "tanh";
      result = fn(tanh ? "gelu_tanh" : "gelu_erf", {value(0, "self", 0, ok)});
      return ok;
    }
    case Op::leaky_relu:
      result = fn("leaky_relu", {value(0, "self", 0, ok)}, {param(1, "negative_slope", 0.01)});
      return ok;
    case Op::hardtanh:
      result = fn("hardtanh", {value(0, "self", 0, ok)},
                  {param(1, "min_val", -1.0), param(2, "max_val", 1.0)});
      return ok;
    case Op::clamp:
    case Op::clamp_min:
    case Op::clamp_max: {
      const int lo_pos = n.op == Op::clamp_max ? -1 : 1;
      const int hi_pos = n.op == Op::clamp ? 2 : n.op == Op::clamp_max ? 1 : -1;
      if (is_tensor(lo_pos, "min") || is_tensor(hi_pos, "max")) {
        // Tensor bounds (clamp.Tensor): maximum with the lower, minimum with the upper bound.
        int x = value(0, "self", 0, ok);
        if (n.arg(lo_pos, "min") && n.arg(lo_pos, "min")->kind != Arg::Kind::none) {
          x = fn("maximum", {x, value(lo_pos, "min", -INFINITY, ok)});
        }
        if (n.arg(hi_pos, "max") && n.arg(hi_pos, "max")->kind != Arg::Kind::none) {
          x = fn("minimum", {x, value(hi_pos, "max", INFINITY, ok)});
        }
        result = x;
        return ok;
      }
      result = fn("clamp", {value(0, "self", 0, ok)},
                  {param(lo_pos, "min", -INFINITY), param(hi_pos, "max", INFINITY)});
      return ok;
    }
    case Op::softplus:
      result = fn("softplus", {value(0, "self", 0, ok)},
                  {param(1, "beta", 1.0), param(2, "threshold", 20.0)});
      return ok;
    case Op::elu:
      result = fn("elu", {value(0, "self", 0, ok)},
                  {param(1, "alpha", 1.0), param(2, "scale", 1.0), param(3, "input_scale", 1.0)});
      return ok;
    case Op::lowered: {
      const auto& l = g.lowerings.at(ir::aten_base(n.target_op));
      const size_t k = l["inputs"].size();
      std::vector<int> ids;
      for (const auto& e : l["ssa"]) {
        const std::string op = e["op"];
        if (op == "input") {
          const size_t i = e["index"];
          ids.push_back(value(static_cast<int>(i), l["inputs"][i], 0, ok));
        } else if (op == "param") {
          const auto& p = l["params"][e["index"].get<size_t>()];
          Expr c;
          c.kind = Expr::Kind::constant;
          c.value = param(static_cast<int>(k + e["index"].get<size_t>()), p["name"], p["default"]);
          ids.push_back(out.add(c));
        } else if (op == "constant") {
          Expr c;
          c.kind = Expr::Kind::constant;
          c.value = e["value"];
          ids.push_back(out.add(c));
        } else {
          std::vector<int> args;
          for (const auto& a : e["args"]) args.push_back(ids.at(a.get<size_t>()));
          ids.push_back(fn(op, args, e.value("params", Params{})));
        }
        if (!ok) break;
      }
      if (!ok) break;
      result = ids.back();
      return true;
    }
    case Op::to_dtype:
    case Op::type_as: {
      result = fn("cast", {value(0, "self", 0, ok)});
      out.exprs[static_cast<size_t>(result)].dtype = ir::dtype_name(n.type().dtype);
      return ok;
    }
    default:
      if (ir::op_class(n.op) == ir::OpClass::pointwise && known_function(name)) {
        result = fn(name, {value(0, "self", 0, ok)});
        return ok;
      }
      why = "'" + n.target_op + "' is not an epilogue function";
      return false;
  }
  why = "'" + n.target_op + "' has an argument that is neither a tensor nor a constant";
  return false;
}

}  // namespace fact::discover
