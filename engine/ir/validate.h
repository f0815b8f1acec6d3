// Semantic checks on a loaded graph (ir/json_io.h has already resolved references).
//
// Raises UserError naming the node: a call without the tensor types the rules need, strides that
// do not match the shape, a placeholder without a type, graph outputs missing.
#pragma once

#include <string>

#include "ir/graph.h"

namespace fact::ir {

void validate(const Graph& g, const std::string& origin);

}  // namespace fact::ir
