// `fact explain`: why a node is, or is not, covered by a pattern, with the nearest misses.
#pragma once

#include <nlohmann/json.hpp>

#include "discover/planner.h"
#include "ir/graph.h"

namespace fact::discover {

// JSON: node, covered_by (or null), lost_candidates, misses (nearest first), note.
nlohmann::json explain(const ir::Graph& g, const Discovery& d, int node);

}  // namespace fact::discover
