#include "pipeline.h"

#include "discover/catalog.h"
#include "ir/json_io.h"
#include "realize/config_space.h"
#include "registry/registry.h"

namespace fact {

using nlohmann::json;

namespace {

json names(const ir::Graph& g, const std::vector<int>& ids) {
  json out = json::array();
  for (int id : ids) out.push_back(g.node(id).name);
  return out;
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
            {"search_space", realize::search_space(m, arch)},
            {"vetted", json::array()}};
  if (!m.epilogue_expr.is_null()) p["epilogue_expr"] = m.epilogue_expr;
  if (reg) {
    for (const auto& hit : reg->lookup(p["signature"], arch, m.problem)) {
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

}  // namespace

DiscoverResult run_discover(const DiscoverOptions& opt) {
  DiscoverResult r;
  // 1. The traced graph, validated (errors name the node).
  r.graph = ir::load_graph_file(opt.graph_path);
  const auto& hw = discover::hardware(opt.arch, opt.gpu);
  // 2. Every rule at every root, costed, then the best non-overlapping set.
  const discover::CostModel cost(hw, r.graph.precision);
  r.discovery = discover::discover(r.graph, cost);
  // 3. What the registry has vetted for similar work (may be empty on a cold machine).
  const std::string reg_path = opt.registry_path.empty() ? registry::Registry::default_path() : opt.registry_path;
  const auto reg = registry::Registry::open_readonly(reg_path);
  // 4. The plan.
  const auto& g = r.graph;
  const auto& d = r.discovery;
  json patterns = json::array();
  for (const auto& c : d.chosen) patterns.push_back(pattern_json(g, c, hw.arch, reg));
  json pytorch = json::array();
  for (int id : d.uncovered) pytorch.push_back({{"name", g.node(id).name}, {"op", g.node(id).target_op}});
  json free = json::array();
  for (int id : d.free) free.push_back({{"name", g.node(id).name}, {"op", g.node(id).target_op}});
  json opaque = json::array();
  for (int id : d.opaque) opaque.push_back({{"name", g.node(id).name}, {"op", g.node(id).target_op}});
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
            {"registry", {{"path", reg_path}, {"rows", reg ? json(reg->count()) : json(nullptr)}}},
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

}  // namespace fact
