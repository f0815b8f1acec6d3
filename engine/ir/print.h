// Human-readable listing of a graph, one node a line: `%name = op(args) : type  [module]`.
#pragma once

#include <ostream>

#include "ir/graph.h"

namespace fact::ir {

void print_graph(const Graph& g, std::ostream& os);

}  // namespace fact::ir
