#include "report.h"

#include <cstdio>
#include <iomanip>
#include <sstream>
#include <string>

namespace fact {

using nlohmann::json;

namespace {

std::string us(double v) {
  char buf[32];
  if (v >= 1000) {
    std::snprintf(buf, sizeof buf, "%.2f ms", v / 1000);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f us", v);
  }
  return buf;
}

std::string join(const json& list, const char* sep) {
  std::string s;
  for (size_t i = 0; i < list.size(); ++i) s += (i ? sep : "") + list[i].get<std::string>();
  return s;
}

// Sizes in a fixed, short form: "m=65536 n=3072 k=768", "b=128 h=8 s=512 d=96".
std::string problem_text(const json& p) {
  static const std::pair<const char*, const char*> keys[] = {
      {"batch", "b"}, {"m", "m"},       {"n", "n"},         {"k", "k"},     {"heads", "h"},
      {"kv_heads", "hkv"}, {"seq_q", "s"}, {"seq_k", "sk"}, {"head_dim", "d"}, {"rows", "rows"},
      {"cols", "cols"}};
  std::ostringstream os;
  for (const auto& [key, abbrev] : keys) {
    if (!p.contains(key) || !p[key].is_number()) continue;
    const auto v = p[key].get<int64_t>();
    if (std::string(key) == "batch" && v == 1) continue;
    if (std::string(key) == "kv_heads" && p.value("heads", int64_t{0}) == v) continue;
    if (std::string(key) == "seq_k" && p.value("seq_q", int64_t{0}) == v) continue;
    os << (os.tellp() > 0 ? " " : "") << abbrev << "=" << v;
  }
  return os.str();
}

std::string pad(std::string s, size_t w) {
  if (s.size() > w) return s.substr(0, w - 1) + "~";
  s.resize(w, ' ');
  return s;
}

}  // namespace

void print_plan(const json& plan, std::ostream& os) {
  const auto& s = plan["summary"];
  os << "FACT plan for " << plan["source"].get<std::string>() << " (" << plan["model"].get<std::string>()
     << ", " << plan["dtype"].get<std::string>() << ", fp32 matmul precision "
     << plan["float32_matmul_precision"].get<std::string>() << ") on " << plan["gpu"].get<std::string>()
     << " (" << plan["arch"].get<std::string>() << ")\n";
  os << s["nodes"] << " nodes, " << s["compute_nodes"] << " compute; " << plan["patterns"].size()
     << " patterns cover " << s["covered_compute_nodes"] << " of them\n\n";
  os << " #  " << pad("family", 16) << pad("anchor", 14) << pad("epilogue", 34) << pad("problem", 44)
     << pad("eager", 10) << pad("fused", 10) << "saving\n";
  int i = 0;
  for (const auto& p : plan["patterns"]) {
    std::string ep = join(p["epilogue"], ", ");
    std::string extra;
    const auto& a = p["attrs"];
    if (a.contains("causal") && a["causal"].get<bool>()) extra = " causal";
    os << std::setw(2) << ++i << "  " << pad(p["family"].get<std::string>(), 16)
       << pad(p["anchors"][0].get<std::string>(), 14) << pad(ep.empty() ? "-" : ep, 34)
       << pad(problem_text(p["problem"]) + extra, 44) << pad(us(p["est_unfused_us"]), 10)
       << pad(us(p["est_fused_us"]), 10) << us(p["est_saving_us"]) << "\n";
  }
  os << "\nestimated: eager " << us(s["est_eager_us"]) << " -> " << us(s["est_after_us"]) << " (saving "
     << us(s["est_saving_us"]) << ")\n";
  std::vector<std::string> per_call, once;
  for (const auto& n : plan["pytorch_nodes"]) {
    (n.value("once", false) ? once : per_call).push_back(n["name"].get<std::string>());
  }
  if (!per_call.empty()) {
    os << "runs in PyTorch (" << per_call.size() << "):";
    for (const auto& n : per_call) os << " " << n;
    os << "\n";
  }
  if (!once.empty()) {
    os << "computed from parameters alone, once and again when they change (" << once.size() << "):";
    for (const auto& n : once) os << " " << n;
    os << "\n";
  }
  const auto& opaque = plan["opaque_nodes"];
  if (!opaque.empty()) {
    os << "opaque ops, unknown to the catalog, kept and run in PyTorch (" << opaque.size() << "):";
    for (const auto& n : opaque) {
      os << " " << n["name"].get<std::string>() << " [" << n["op"].get<std::string>()
         << (n.value("once", false) ? ", once" : "") << "]";
    }
    os << "\n  (an elementwise one can get a lowering: `fact agent propose PROBLEM.py --out DIR`)\n";
  }
  if (plan.contains("lowerings") && !plan["lowerings"].empty()) {
    os << "lowered through the registry's accepted lowerings:";
    for (const auto& l : plan["lowerings"]) os << " " << l.get<std::string>();
    os << "\n";
  }
  const auto& reg = plan["registry"];
  os << "registry: " << reg["path"].get<std::string>()
     << (reg["rows"].is_null() ? " (none yet: a cold start)" : " (" + reg["rows"].dump() + " rows)");
  int vetted = 0;
  for (const auto& p : plan["patterns"]) vetted += static_cast<int>(p["vetted"].size());
  os << "; " << vetted << " vetted configs for these patterns\n";
  os << "rule hits:";
  for (const auto& [rule, count] : plan["rule_hits"].items()) os << " " << rule << "=" << count;
  os << "\n";
}

void print_explain(const json& e, std::ostream& os) {
  const auto& n = e["node"];
  os << "node '" << n["name"].get<std::string>() << "': " << n["op"].get<std::string>() << " ("
     << n["class"].get<std::string>() << ")";
  if (!n["type"].get<std::string>().empty()) os << " -> " << n["type"].get<std::string>();
  if (!n["module"].get<std::string>().empty()) os << "  in " << n["module"].get<std::string>();
  os << "\n";
  if (!e["covered_by"].is_null()) {
    const auto& c = e["covered_by"];
    os << "covered by pattern #" << c["plan_index"] << ": " << c["family"].get<std::string>() << " (rule "
       << c["rule"].get<std::string>() << " at '" << c["root"].get<std::string>() << "')";
    if (!c["epilogue"].empty()) os << ", epilogue " << join(c["epilogue"], ", ");
    os << ", saving ~" << us(c["est_saving_us"]) << "\n  nodes: " << join(c["nodes"], " ") << "\n";
  }
  if (!e["note"].get<std::string>().empty()) os << e["note"].get<std::string>() << "\n";
  for (const auto& l : e["lost_candidates"]) {
    os << "also matched by " << l["rule"].get<std::string>() << " at '" << l["root"].get<std::string>()
       << "', not chosen: " << l["why"].get<std::string>() << "\n";
  }
  if (!e["rules_rooted_here"].empty()) {
    os << "rules rooted at this op: " << join(e["rules_rooted_here"], ", ") << "\n";
  } else {
    os << "no rule is rooted at this op\n";
  }
  if (!e["misses"].empty()) {
    os << "nearest misses:\n";
    for (const auto& m : e["misses"]) {
      os << "  - " << m["rule"].get<std::string>() << " at '" << m["at"].get<std::string>() << "': "
         << m["reason"].get<std::string>() << "\n";
    }
  }
}

}  // namespace fact
