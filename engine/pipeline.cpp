#include "pipeline.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include "discover/catalog.h"
#include "discover/lowering.h"
#include "ir/error.h"
#include "families/attention/attention.h"
#include "families/family.h"
#include "families/gemm/candidates.h"
#include "families/gemm/emit.h"
#include "families/norm/norm.h"
#include "families/pointwise/pointwise.h"
#include "ir/json_io.h"
#include "realize/compile.h"
#include "registry/registry.h"
#include "util/files.h"

namespace fact {

using nlohmann::json;

namespace {

json names(const ir::Graph& g, const std::vector<int>& ids) {
  json out = json::array();
  for (int id : ids) out.push_back(g.node(id).name);
  return out;
}

// The registry is a hint (vetted configs, the ranking of candidates): one that cannot be read
// is said once, with how to recover, and planning goes on without it.
void warn_registry(const std::string& path, const std::string& why) {
  static bool said = false;
  if (said) return;
  said = true;
  std::cerr << "warning: the pattern registry " << path << " cannot be read (" << why
            << "); planning without it. `fact registry salvage --registry " << path
            << " -o rows.json` keeps the rows it can still read (import them into a new file), or "
               "move the file away\n";
}

std::optional<registry::Registry> open_hint(const std::string& path) {
  try {
    return registry::Registry::open_readonly(path);
  } catch (const std::exception& e) {
    warn_registry(path, e.what());
    return std::nullopt;
  }
}

json rows_of(const std::optional<registry::Registry>& reg) {
  if (!reg) return nullptr;
  try {
    return reg->count();
  } catch (const std::exception& e) {
    warn_registry(reg->path(), e.what());
    return nullptr;
  }
}

json pattern_json(const ir::Graph& g, const discover::Candidate& c, const std::string& arch,
                  const std::optional<registry::Registry>& reg) {
  const auto& m = c.match;
  json operands = json::array();
  for (const auto& o : m.operands) {
    json j = {{"role", o.role}, {"node", g.node(o.node).name}, {"type", g.node(o.node).type().str()}};
    if (!o.broadcast.empty()) j["broadcast"] = o.broadcast;
    operands.push_back(j);
  }
  json p = {{"family", discover::family_name(m.family)},
            {"rule", m.rule},
            {"nodes", names(g, m.nodes)},
            {"anchors", names(g, m.anchors)},
            {"output", g.node(m.output).name},
            {"epilogue", m.epilogue},
            {"problem", m.problem},
            {"attrs", m.attrs},
            {"operands", operands},
            {"signature", registry::signature(m)},
            {"est_unfused_us", c.unfused.seconds * 1e6},
            {"est_fused_us", c.fused.seconds * 1e6},
            {"est_saving_us", c.saving_s() * 1e6},
            {"est_launches_saved", c.unfused.launches - c.fused.launches},
            {"search_space", families::family(m.family).search_space(m, arch)},
            {"vetted", json::array()}};
  if (!m.epilogue_expr.is_null()) p["epilogue_expr"] = m.epilogue_expr;
  std::vector<registry::Hit> hits;
  if (reg) {
    try {
      hits = reg->lookup(p["signature"], arch, m.problem);
    } catch (const std::exception& e) {  // a registry damaged past its header: plan without it
      warn_registry(reg->path(), e.what());
    }
  }
  if (!hits.empty()) {
    for (const auto& hit : hits) {
      p["vetted"].push_back({{"match", hit.match},
                             {"distance", hit.distance},
                             {"problem", hit.row.problem},
                             {"config", hit.row.config},
                             {"time_us", hit.row.time_us},
                             {"provenance", hit.row.provenance}});
    }
  }
  return p;
}


// Accepted lowerings from the registry, then those of `file` (a list; an unreadable or invalid
// one is the user's error, named). A registry lowering that no longer passes the checks is
// skipped with a warning: the registry is a hint.
std::vector<json> lowerings(const std::optional<registry::Registry>& reg, const std::string& file) {
  std::vector<json> out;
  if (reg) {
    try {
      for (const auto& p : reg->proposals("lowering", "accepted")) {
        try {
          out.push_back(discover::check_lowering(p.payload, "registry proposal " + std::to_string(p.id)));
        } catch (const UserError& e) {
          std::cerr << "warning: " << e.what() << "; not used\n";
        }
      }
    } catch (const std::exception& e) {
      warn_registry(reg->path(), e.what());
    }
  }
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) throw UserError("lowerings file " + file + " cannot be read");
    const json doc = json::parse(in, nullptr, false);
    if (doc.is_discarded() || !doc.is_array()) throw UserError("lowerings file " + file + ": not a JSON list");
    for (size_t i = 0; i < doc.size(); ++i) {
      out.push_back(discover::check_lowering(doc[i], file + ": lowering " + std::to_string(i)));
    }
  }
  return out;
}

}  // namespace

DiscoverResult run_discover(const DiscoverOptions& opt) {
  DiscoverResult r;
  // 1. The traced graph, validated (errors name the node).
  r.graph = ir::load_graph_file(opt.graph_path);
  const auto& hw = discover::hardware(opt.arch, opt.gpu);
  // 2. The registry: vetted configs for similar work (may be empty on a cold machine), and the
  //    lowerings of ops the catalog lacks that the agent proposed and FACT's checks accepted.
  const std::string reg_path = opt.registry_path.empty() ? registry::Registry::default_path() : opt.registry_path;
  const auto reg = open_hint(reg_path);
  const auto lowered = discover::apply_lowerings(r.graph, lowerings(reg, opt.lowerings_path));
  // 3. Every rule at every root, costed, then the best non-overlapping set.
  const discover::CostModel cost(hw, r.graph.precision);
  r.discovery = discover::discover(r.graph, cost);
  // 4. The plan.
  const auto& g = r.graph;
  const auto& d = r.discovery;
  json patterns = json::array();
  for (const auto& c : d.chosen) {
    patterns.push_back(pattern_json(g, c, hw.arch, reg));
    if (const auto forms = families::family(c.match.family).plan_forms) forms(g, c.match, patterns.back());
  }
  // Nodes by name and op; `once` marks those computed from parameters alone (hoisted).
  auto node_list = [&](const std::vector<int>& ids, bool mark_once) {
    json list = json::array();
    for (int id : ids) {
      json n = {{"name", g.node(id).name}, {"op", g.node(id).target_op}};
      if (mark_once && d.state_only[static_cast<size_t>(id)]) n["once"] = true;
      list.push_back(n);
    }
    return list;
  };
  const json pytorch = node_list(d.uncovered, true);
  const json free = node_list(d.free, false);
  const json opaque = node_list(d.opaque, true);
  json rejected = json::array();
  for (size_t i = 0; i < d.rejected.size(); ++i) {
    const auto& c = d.rejected[i];
    rejected.push_back({{"rule", c.match.rule},
                        {"root", g.node(c.match.root).name},
                        {"nodes", names(g, c.match.nodes)},
                        {"est_saving_us", c.saving_s() * 1e6},
                        {"why", d.rejected_why[i]}});
  }
  int compute = 0, covered = 0;
  for (const auto& n : g.nodes) compute += discover::is_compute(g, n.id) ? 1 : 0;
  covered = compute - static_cast<int>(d.uncovered.size());
  r.plan = {{"fact_plan_version", 1},
            {"source", g.source},
            {"model", g.model},
            {"dtype", g.dtype},
            {"float32_matmul_precision", g.precision},
            {"arch", hw.arch},
            {"gpu", hw.gpu},
            {"registry", {{"path", reg_path}, {"rows", rows_of(reg)}}},
            {"lowerings", lowered},
            {"patterns", patterns},
            {"pytorch_nodes", pytorch},
            {"free_nodes", free},
            {"opaque_nodes", opaque},
            {"rejected", rejected},
            {"rule_hits", d.rule_hits},
            {"summary",
             {{"nodes", g.size()},
              {"compute_nodes", compute},
              {"covered_compute_nodes", covered},
              {"est_eager_us", d.total_unfused.seconds * 1e6},
              {"est_saving_us", d.total_saving_s * 1e6},
              {"est_after_us", (d.total_unfused.seconds - d.total_saving_s) * 1e6}}}};
  return r;
}

namespace {

std::string results_table(const json& manifest) {
  std::ostringstream os;
  os << "| pattern | family | kernel | status | detail |\n| --- | --- | --- | --- | --- |\n";
  for (const auto& e : manifest) {
    os << "| " << e["pattern_index"] << " | " << e["family"].get<std::string>() << " | "
       << e.value("kernel", std::string("-")) << " | " << e["status"].get<std::string>() << " | "
       << e.value("detail", std::string()) << " |\n";
  }
  return os.str();
}

}  // namespace

RealizeResult run_realize(const RealizeOptions& opt) {
  namespace fs = std::filesystem;
  RealizeResult r;
  // --configs: names only, checked before any work (whether a pattern can use one is its own
  // business: see realize::candidates).
  std::vector<std::string> configs, attention_configs;
  for (const auto& raw : opt.configs) {
    const auto first = raw.find_first_not_of(" \t"), last = raw.find_last_not_of(" \t");
    if (first == std::string::npos) continue;
    const auto name = raw.substr(first, last - first + 1);
    if (realize::AttentionConfig::is_name(name)) {
      attention_configs.push_back(name);
      continue;
    }
    if (!realize::GemmConfig::is_name(name)) {
      throw UserError("--configs: '" + name +
                      "' is not a config name; names look like t128x256x64_c2x1_coop_tmacoop_sauto_persistent "
                      "(GEMM: tile, cluster, kernel and epilogue schedule, stages, tile scheduler) or "
                      "q128kv128_pp_s5 (attention: tiles, schedule, K/V stages); see candidates/pattern-N.json "
                      "of a realize run");
    }
    configs.push_back(name);
  }
  // 1. Discover (the plan), exactly as `fact discover` would.
  auto d = run_discover(opt.discover);
  r.plan = d.plan;
  const fs::path run(opt.run_dir);
  try {
    // A run directory used before holds another plan's kernels: what realize wrote there goes,
    // so that src/ and lib/ hold this plan's and nothing else.
    for (const char* sub : {"src", "lib", "candidates"}) {
      if (fs::is_directory(run / sub)) {
        for (const auto& f : fs::directory_iterator(run / sub)) {
          const auto ext = f.path().extension();
          if (f.is_regular_file() && (ext == ".cu" || ext == ".so" || ext == ".h" || ext == ".json")) fs::remove(f.path());
        }
      }
      fs::create_directories(run / sub);
    }
  } catch (const fs::filesystem_error& e) {
    throw UserError("run directory " + opt.run_dir + ": " + e.code().message() + " (pass --out a writable folder)");
  }
  write_text_file(run / "plan.json", r.plan.dump(2));
  auto reg = open_hint(r.plan["registry"]["path"].get<std::string>());
  if (reg && rows_of(reg).is_null()) reg.reset();  // damaged past its header: rank without it
  struct Pending {
    size_t pattern;
    std::string kernel;
    json config;
  };
  std::vector<realize::CompileJob> jobs;
  std::vector<Pending> pending;
  std::set<std::string> seen;
  r.manifest = json::array();
  // A pattern (or one config of it) FACT cannot build: its manifest row says why.
  auto refuse = [&](json entry, const std::string& why) {
    entry["status"] = "not_supported";
    entry["detail"] = why;
    r.manifest.push_back(std::move(entry));
    ++r.not_supported;
  };
  // One emitted kernel of pattern i: its source once, its manifest row after compiling.
  auto add_kernel = [&](size_t i, realize::EmittedKernel k, json config) {
    pending.push_back({i, k.name, std::move(config)});
    if (seen.insert(k.name).second) {
      write_text_file(run / "src" / (k.name + ".cu"), k.source);
      jobs.push_back({k.name, std::move(k.source)});
    }
  };
  // 2. Each chosen pattern through its family's realize step (engine/families/family.h).
  for (size_t i = 0; i < d.discovery.chosen.size(); ++i) {
    const auto& match = d.discovery.chosen[i].match;
    const auto& pattern = r.plan["patterns"][i];
    families::RealizeStep step;
    step.match = &match;
    step.pattern = &pattern;
    step.arch = opt.discover.arch;
    step.candidates = opt.candidates;
    step.precision = r.plan["float32_matmul_precision"];
    step.registry = reg ? &*reg : nullptr;
    step.gemm_configs = configs;
    step.attention_configs = attention_configs;
    step.candidates_file = run / "candidates" / ("pattern-" + std::to_string(i) + ".json");
    step.base = {{"pattern_index", i}, {"family", pattern["family"]}, {"signature", pattern["signature"]}};
    step.add_kernel = [&, i](realize::EmittedKernel k, json config) { add_kernel(i, std::move(k), std::move(config)); };
    step.refuse = refuse;
    families::family(match.family).realize(step);
  }
  write_text_file(run / "src" / "fact_gemm_abi.h", realize::abi_header_text());
  write_text_file(run / "src" / "fact_norm_abi.h", realize::norm_abi_header_text());
  write_text_file(run / "src" / "fact_attention_abi.h", realize::attention_abi_header_text());
  write_text_file(run / "src" / "fact_pointwise_abi.h", realize::pointwise_abi_header_text());
  // 3. Compile what the cache does not hold yet, in parallel.
  realize::CompileOptions copt;
  copt.cutlass_dir = opt.cutlass_dir;
  copt.nvcc = opt.nvcc;
  copt.cache_dir = opt.cache_dir;
  copt.arch = opt.discover.arch;
  copt.jobs = opt.jobs;
  copt.quiet = opt.quiet;
  if (opt.compile_timeout_s >= 0) copt.timeout_s = opt.compile_timeout_s;
  if (!opt.quiet && !jobs.empty()) std::cerr << "compiling " << jobs.size() << " kernels for " << opt.discover.arch << "\n";
  const auto results = jobs.empty() ? std::vector<realize::CompileResult>{} : realize::compile_all(jobs, copt);
  std::map<std::string, const realize::CompileResult*> by_name;
  for (const auto& res : results) {
    by_name[res.name] = &res;
    if (res.ok) {
      std::error_code ec;
      fs::copy_file(res.library, run / "lib" / (res.name + ".so"), fs::copy_options::overwrite_existing, ec);
      if (ec) throw UserError("cannot copy " + res.library + " into " + opt.run_dir + ": " + ec.message());
      ++(res.cached ? r.cached : r.compiled);
    } else {
      ++r.failed;
    }
  }
  // 4. The manifest: one row per (pattern, kernel), libraries relative to the run directory.
  for (const auto& p : pending) {
    const auto* res = by_name.at(p.kernel);
    const auto& pattern = r.plan["patterns"][p.pattern];
    // What the kernel computes, and so what it is tuned and looked up in the registry as: the
    // pattern, its lowered GEMM (a gated MLP), or its pointwise tail (a library-GEMM form's kernels).
    const json& computes = p.config.value("form", "") == "tail" ? pattern["tail"]
                           : pattern.contains("lowered")        ? pattern["lowered"]
                                                                : pattern;
    json entry = {{"pattern_index", p.pattern},
                  {"family", pattern["family"]},
                  {"signature", pattern["signature"]},
                  {"measures", {{"family", computes["family"]},
                                {"signature", computes["signature"]},
                                {"problem", computes["problem"]}}},
                  {"kernel", p.kernel},
                  {"config", p.config},
                  {"cache_key", res->key},
                  {"status", res->ok ? (res->cached ? "cached" : "compiled") : "compile_error"}};
    if (res->ok) {
      entry["library"] = "lib/" + p.kernel + ".so";
      entry["cached_library"] = res->library;  // the cache's copy, which outlives the run
    }
    if (!res->advisories.empty()) {
      entry["advisories"] = res->advisories;
      std::string detail = "ptxas";
      for (size_t i = 0; i < res->advisories.size(); ++i) detail += (i ? "; " : " ") + res->advisories[i];
      entry["detail"] = detail;
    }
    if (!res->ok) {
      entry["detail"] = res->error;
      entry["log"] = res->log;
    }
    r.manifest.push_back(entry);
  }
  write_text_file(run / "manifest.json", r.manifest.dump(2));
  write_text_file(run / "results.md", results_table(r.manifest));
  return r;
}

}  // namespace fact
