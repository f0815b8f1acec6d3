// Discovery and planning: run every catalog rule at every node it can be rooted at, cost each
// match, and choose a non-overlapping set of patterns with the largest estimated saving.
//
// Before: a validated graph. After: a Discovery holding the chosen patterns (by priority), the
// losing candidates with what beat them, every miss (for `fact explain`), rule hit counts, and
// the nodes left to PyTorch (opaque ones called out).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "discover/cost_model.h"
#include "discover/pattern.h"
#include "ir/graph.h"

namespace fact::discover {

struct Candidate {
  Match match;
  Cost unfused;
  Cost fused;
  double saving_s() const { return unfused.seconds - fused.seconds; }
};

struct Discovery {
  std::vector<Candidate> chosen;      // highest saving first
  std::vector<Candidate> rejected;    // overlapped a better choice, or no saving
  std::vector<std::string> rejected_why;
  std::vector<Miss> misses;
  std::map<std::string, int> rule_hits;  // matches per rule, before planning
  std::vector<int> uncovered;            // compute nodes no chosen pattern covers: PyTorch runs them
  std::vector<int> free;                 // uncovered views, identities and asserts: no kernel at all
  std::vector<int> opaque;               // nodes the vocabulary does not know
  // Per node: its value depends on parameters, buffers and constants alone (no input). The
  // planner proposes no pattern of such nodes; the composed module computes them once.
  std::vector<char> state_only;
  Cost total_unfused;                    // the whole graph, eager
  double total_saving_s = 0;
};

Discovery discover(const ir::Graph& g, const CostModel& cost);

// Nodes that run a kernel or compute something (not placeholders, views or asserts).
bool is_compute(const ir::Graph& g, int id);

}  // namespace fact::discover
