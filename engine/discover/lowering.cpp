#include "discover/lowering.h"

#include <cmath>
#include <regex>
#include <set>

#include "discover/expr.h"
#include "ir/error.h"

namespace fact::discover {

using nlohmann::json;

namespace {

// A name from a proposal, fit to quote in a message: at most 40 printable characters.
std::string quoted(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, 40)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return "'" + out + "'";
}

bool plain_name(const std::string& s) {
  static const std::regex name("[A-Za-z][A-Za-z0-9_]{0,63}");
  return std::regex_match(s, name);
}

double number(const json& v, const std::string& where) {
  if (!v.is_number()) throw UserError(where + " must be a number, not " + v.dump().substr(0, 60));
  const double x = v.get<double>();
  if (!std::isfinite(x)) throw UserError(where + " must be finite");
  return x;
}

}  // namespace

json check_lowering(const json& doc, const std::string& where) {
  auto bad = [&](const std::string& what) { throw UserError(where + ": " + what); };
  if (!doc.is_object()) bad("a lowering is a JSON object");
  for (const auto& [k, v] : doc.items()) {
    static const std::set<std::string> keys = {"op", "inputs", "params", "ssa"};
    if (!keys.count(k)) bad("unknown key " + quoted(k) + " (expected op, inputs, params, ssa)");
  }
  if (!doc.contains("op") || !doc["op"].is_string() || !plain_name(doc["op"])) {
    bad("\"op\" must be an ATen op's base name (letters, digits, _)");
  }
  if (doc["op"].get<std::string>().back() == '_') {
    bad("\"op\" names an in-place op: its write is not an expression (in-place forms of known ops are read "
        "as the op where nothing sees the write)");
  }
  json out = {{"op", doc["op"]}, {"inputs", json::array()}, {"params", json::array()}, {"ssa", json::array()}};
  const json inputs = doc.value("inputs", json::array());
  if (!inputs.is_array() || inputs.empty() || inputs.size() > 3) bad("\"inputs\" must list 1 to 3 tensor arguments");
  for (const auto& i : inputs) {
    if (!i.is_string() || !plain_name(i)) bad("an input must be an argument name");
    out["inputs"].push_back(i);
  }
  const json params = doc.value("params", json::array());
  if (!params.is_array() || params.size() > 4) bad("\"params\" must list at most 4 numeric arguments");
  for (const auto& p : params) {
    if (!p.is_object() || !p.contains("name") || !p["name"].is_string() || !plain_name(p["name"])) {
      bad("a param must be {\"name\": argument name, \"default\": number}");
    }
    if (!p.contains("default")) bad("param '" + p["name"].get<std::string>() + "' has no default");
    out["params"].push_back({{"name", p["name"]}, {"default", number(p["default"], where + ": its default")}});
  }
  const json ssa = doc.value("ssa", json());
  if (!ssa.is_array() || ssa.empty()) bad("\"ssa\" must be a non-empty list");
  if (ssa.size() > kMaxLoweringSteps) {
    bad("\"ssa\" has " + std::to_string(ssa.size()) + " entries; at most " + std::to_string(kMaxLoweringSteps));
  }
  for (size_t i = 0; i < ssa.size(); ++i) {
    const json& e = ssa[i];
    const std::string at = "ssa entry " + std::to_string(i);
    if (!e.is_object() || !e.contains("op") || !e["op"].is_string()) bad(at + " has no \"op\"");
    if (e.contains("id") && (!e["id"].is_number_integer() || e["id"].get<int64_t>() != static_cast<int64_t>(i))) {
      bad(at + ": ids count 0, 1, 2, ... in order");
    }
    const std::string op = e["op"];
    json n = {{"id", i}, {"op", op}};
    if (op == "input" || op == "param") {
      const size_t limit = op == "input" ? out["inputs"].size() : out["params"].size();
      if (!e.contains("index") || !e["index"].is_number_integer() || e["index"].get<int64_t>() < 0 ||
          static_cast<size_t>(e["index"].get<int64_t>()) >= limit) {
        bad(at + ": " + op + " index out of range");
      }
      n["index"] = e["index"];
    } else if (op == "constant") {
      if (!e.contains("value")) bad(at + ": a constant has a \"value\"");
      n["value"] = number(e["value"], where + ": " + at + " value");
    } else {
      const int arity = function_arity(op);
      if (arity < 0) bad(at + ": " + quoted(op) + " is not a function of the vocabulary");
      const json args = e.value("args", json::array());
      if (!args.is_array() || static_cast<int>(args.size()) != arity) {
        bad(at + ": '" + op + "' takes " + std::to_string(arity) + " argument(s)");
      }
      for (const auto& a : args) {
        if (!a.is_number_integer() || a.get<int64_t>() < 0 || a.get<int64_t>() >= static_cast<int64_t>(i)) {
          bad(at + ": an argument must be the id of an earlier entry");
        }
      }
      n["args"] = args;
      if (e.contains("params")) {
        if (!e["params"].is_array() || e["params"].size() > 3) bad(at + ": \"params\" is a list of at most 3 numbers");
        n["params"] = json::array();
        for (const auto& p : e["params"]) n["params"].push_back(number(p, where + ": " + at + " params"));
      }
      if (op == "cast") bad(at + ": no casts in a lowering");
    }
    out["ssa"].push_back(n);
  }
  return out;
}

std::vector<std::string> apply_lowerings(ir::Graph& g, const std::vector<json>& lowerings) {
  std::map<std::string, json> by_op;
  for (const auto& l : lowerings) by_op[l.at("op").get<std::string>()] = l;  // the last given wins
  std::set<std::string> applied;
  for (auto& n : g.nodes) {
    if (n.op != ir::Op::opaque) continue;
    const auto it = by_op.find(ir::aten_base(n.target_op));
    // Checked against the op's default overload only: another overload may mean another thing.
    if (it == by_op.end() || n.target_op != "aten." + it->first + ".default") continue;
    const json& l = it->second;
    if (n.outputs.size() != 1 || !ir::is_floating(n.type().dtype)) continue;
    const size_t k = l["inputs"].size();
    bool fits = n.args.size() <= k + l["params"].size();
    for (size_t i = 0; i < n.args.size() && fits; ++i) {
      const auto& a = n.args[i];
      fits = i < k ? (a.is_node() || a.is_number()) : (a.is_number() || a.kind == ir::Arg::Kind::none);
    }
    for (const auto& [key, a] : n.kwargs) {
      bool known = false;
      for (const auto& p : l["params"]) known = known || p["name"] == key;
      fits = fits && known && (a.is_number() || a.kind == ir::Arg::Kind::none);
    }
    if (!fits) continue;
    n.op = ir::Op::lowered;
    g.lowerings[it->first] = l;
    applied.insert(it->first);
  }
  return {applied.begin(), applied.end()};
}

}  // namespace fact::discover
