// Reading and writing FACT graph JSON (docs/graph-format.md).
//
// load_graph_* resolve node references and reject anything malformed with a UserError that names
// the file, the node and the problem. The result has been finalize()d and validate()d.
#pragma once

#include <string>

#include "ir/graph.h"

namespace fact::ir {

inline constexpr int kGraphFormatVersion = 1;

Graph load_graph_file(const std::string& path);
Graph load_graph_string(const std::string& text, const std::string& origin = "<string>");

}  // namespace fact::ir
