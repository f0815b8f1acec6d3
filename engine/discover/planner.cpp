#include "discover/planner.h"

#include <algorithm>
#include <functional>

#include "discover/catalog.h"
#include "discover/views.h"
#include "util/strings.h"

namespace fact::discover {

using ir::Graph;
using ir::OpClass;

bool is_compute(const Graph& g, int id) {
  const auto& n = g.node(id);
  if (n.is_placeholder()) return false;
  const auto cls = ir::op_class(n.op);
  return cls != OpClass::view && cls != OpClass::meta && !is_identity(g, n);
}

namespace {

bool overlap(const std::vector<int>& a, const std::vector<int>& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] == b[j]) return true;
    a[i] < b[j] ? ++i : ++j;
  }
  return false;
}

// Score: estimated saving, ties broken by coverage (a nanosecond per node).
double score(const Candidate& c) { return c.saving_s() + 1e-9 * static_cast<double>(c.match.nodes.size()); }

// Maximum-score independent set of one conflict component: exact branch and bound for small
// components, greedy by score for large ones.
std::vector<int> select(const std::vector<Candidate>& cands, std::vector<int> ids) {
  std::sort(ids.begin(), ids.end(), [&](int a, int b) { return score(cands[a]) > score(cands[b]); });
  auto conflicts = [&](int a, int b) { return overlap(cands[a].match.nodes, cands[b].match.nodes); };
  std::vector<int> best, cur;
  double best_score = -1;
  // Greedy first: it is also the answer for big components.
  for (int id : ids) {
    if (std::none_of(best.begin(), best.end(), [&](int x) { return conflicts(x, id); })) best.push_back(id);
  }
  best_score = 0;
  for (int id : best) best_score += score(cands[id]);
  if (ids.size() > 24) return best;
  std::vector<double> suffix(ids.size() + 1, 0);
  for (size_t i = ids.size(); i-- > 0;) suffix[i] = suffix[i + 1] + score(cands[ids[i]]);
  std::function<void(size_t, double)> dfs = [&](size_t i, double s) {
    if (s + suffix[i] <= best_score + 1e-15) return;
    if (i == ids.size()) {
      best = cur;
      best_score = s;
      return;
    }
    const int id = ids[i];
    if (std::none_of(cur.begin(), cur.end(), [&](int x) { return conflicts(x, id); })) {
      cur.push_back(id);
      dfs(i + 1, s + score(cands[id]));
      cur.pop_back();
    }
    dfs(i + 1, s);
  };
  dfs(0, 0);
  return best;
}

// Nodes whose values depend on parameters, buffers and constants alone (not on any input).
std::vector<char> state_only(const Graph& g) {
  std::vector<char> s(static_cast<size_t>(g.size()), 0);
  for (const auto& n : g.nodes) {
    if (n.is_placeholder()) {
      s[static_cast<size_t>(n.id)] = n.kind != ir::NodeKind::input;
      continue;
    }
    bool only = true;
    for (int o : g.operands(n)) only = only && s[static_cast<size_t>(o)];
    s[static_cast<size_t>(n.id)] = only;
  }
  return s;
}

constexpr const char* kStateOnly =
    "reads only parameters, buffers and constants: the composed module computes it once, and "
    "again when they change, not on every call";

bool all_state_only(const std::vector<char>& s, const Match& m) {
  return std::all_of(m.nodes.begin(), m.nodes.end(), [&](int id) { return s[static_cast<size_t>(id)] != 0; });
}

// Why candidate `c` is not worth a kernel, or null when it is: work on state alone, or no
// estimated saving (below zero; with `strict`, zero too).
const char* not_worth(const Candidate& c, const std::vector<char>& on_state, bool strict) {
  if (all_state_only(on_state, c.match)) return kStateOnly;
  if (strict ? c.saving_s() <= 0 : c.saving_s() < 0) return "estimated slower fused than as separate PyTorch ops";
  return nullptr;
}

}  // namespace

Discovery discover(const Graph& g, const CostModel& cost) {
  Discovery d;
  d.state_only = state_only(g);
  const std::vector<char>& on_state = d.state_only;
  std::vector<Candidate> cands;
  for (const auto& rule : catalog()) {
    for (const auto& n : g.nodes) {
      if (n.is_placeholder() || !rule.roots.count(n.op)) continue;
      Attempt a = rule.match(g, n.id);
      for (auto& m : a.matches) {
        ++d.rule_hits[rule.name];
        Candidate c{std::move(m), {}, {}};
        c.unfused = cost.unfused(g, c.match.nodes);
        c.fused = cost.fused(g, c.match);
        cands.push_back(std::move(c));
      }
      for (auto& miss : a.misses) d.misses.push_back(std::move(miss));
    }
  }
  // Identical node sets: keep the better estimate.
  std::vector<char> dropped(cands.size(), 0);
  for (size_t i = 0; i < cands.size(); ++i) {
    for (size_t j = i + 1; j < cands.size() && !dropped[i]; ++j) {
      if (dropped[j] || cands[i].match.nodes != cands[j].match.nodes) continue;
      dropped[score(cands[i]) >= score(cands[j]) ? j : i] = 1;
    }
  }
  std::vector<int> viable;
  for (size_t i = 0; i < cands.size(); ++i) {
    if (dropped[i]) continue;
    if (const char* why = not_worth(cands[i], on_state, false)) {
      d.rejected.push_back(cands[i]);
      d.rejected_why.push_back(why);
      continue;
    }
    viable.push_back(static_cast<int>(i));
  }
  // Conflict components (union-find over overlapping candidates).
  std::vector<int> parent(cands.size());
  for (size_t i = 0; i < parent.size(); ++i) parent[i] = static_cast<int>(i);
  std::function<int(int)> root = [&](int x) { return parent[x] == x ? x : parent[x] = root(parent[x]); };
  for (size_t i = 0; i < viable.size(); ++i) {
    for (size_t j = i + 1; j < viable.size(); ++j) {
      if (overlap(cands[viable[i]].match.nodes, cands[viable[j]].match.nodes)) {
        parent[root(viable[i])] = root(viable[j]);
      }
    }
  }
  std::map<int, std::vector<int>> components;
  for (int id : viable) components[root(id)].push_back(id);
  std::vector<char> chosen(cands.size(), 0);
  for (auto& [r, ids] : components) {
    for (int id : select(cands, ids)) chosen[id] = 1;
  }
  std::vector<size_t> lost;  // d.rejected's candidates that lost an overlap
  for (int id : viable) {
    if (chosen[id]) {
      d.chosen.push_back(cands[id]);
      continue;
    }
    std::string by;
    for (int other : viable) {
      if (chosen[other] && overlap(cands[id].match.nodes, cands[other].match.nodes)) {
        by = cands[other].match.rule + " at '" + g.node(cands[other].match.root).name + "'";
        break;
      }
    }
    lost.push_back(d.rejected.size());
    d.rejected.push_back(cands[id]);
    d.rejected_why.push_back("overlaps " + by + ", which saves more");
  }
  std::vector<char> covered(static_cast<size_t>(g.size()), 0);
  for (const auto& c : d.chosen) {
    for (int id : c.match.nodes) covered[static_cast<size_t>(id)] = 1;
  }
  // A candidate that lost an overlap may still have a kernel's worth left: a GEMM whose
  // epilogue another GEMM took (x + attn(x) + mlp(x): one projection takes both adds, the other
  // keeps its bias). Best first, each shrunk match as its rule re-grows it around what is taken.
  std::stable_sort(lost.begin(), lost.end(),
                   [&](size_t a, size_t b) { return score(d.rejected[a]) > score(d.rejected[b]); });
  for (size_t i : lost) {
    const Match& m = d.rejected[i].match;
    const auto rule = std::find_if(catalog().begin(), catalog().end(), [&](const Rule& r) { return r.name == m.rule; });
    if (rule == catalog().end() || !rule->shrink) continue;
    for (auto& s : rule->shrink(g, m.root, covered).matches) {
      const bool free = std::none_of(s.nodes.begin(), s.nodes.end(),
                                     [&](int id) { return covered[static_cast<size_t>(id)] != 0; });
      if (!free) continue;
      Candidate c{std::move(s), {}, {}};
      c.unfused = cost.unfused(g, c.match.nodes);
      c.fused = cost.fused(g, c.match);
      if (not_worth(c, on_state, false)) continue;
      for (int id : c.match.nodes) covered[static_cast<size_t>(id)] = 1;
      d.rejected_why[i] += "; shrunk to what it leaves: " + (c.match.epilogue.empty() ? std::string("no epilogue")
                                                                                       : "epilogue " + join(c.match.epilogue, ", "));
      d.chosen.push_back(std::move(c));
    }
  }
  // What the rules left to PyTorch: pointwise regions, one generated kernel each.
  for (auto& m : pointwise_regions(g, covered)) {
    ++d.rule_hits[m.rule];
    Candidate c{std::move(m), {}, {}};
    c.unfused = cost.unfused(g, c.match.nodes);
    c.fused = cost.fused(g, c.match);
    if (const char* why = not_worth(c, on_state, true)) {
      d.rejected.push_back(c);
      d.rejected_why.push_back(why);
      continue;
    }
    for (int id : c.match.nodes) covered[static_cast<size_t>(id)] = 1;
    d.chosen.push_back(std::move(c));
  }
  std::stable_sort(d.chosen.begin(), d.chosen.end(),
                   [](const Candidate& a, const Candidate& b) { return a.saving_s() > b.saving_s(); });
  for (const auto& c : d.chosen) d.total_saving_s += c.saving_s();
  std::vector<int> all;
  for (const auto& n : g.nodes) {
    if (!n.is_placeholder()) all.push_back(n.id);
    if (!n.is_placeholder() && n.op == ir::Op::opaque) d.opaque.push_back(n.id);
    if (n.is_placeholder() || covered[static_cast<size_t>(n.id)]) continue;
    (is_compute(g, n.id) ? d.uncovered : d.free).push_back(n.id);
  }
  d.total_unfused = cost.unfused(g, all);
  return d;
}

}  // namespace fact::discover
