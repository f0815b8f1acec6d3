// Lowerings: an ATen op the catalog does not know, written as an expression over the function
// vocabulary (discover/expr.h). They arrive as data (the agent's accepted proposals in the
// registry, or a file) and are checked here before the planner sees them; an op with a lowering
// joins GEMM epilogues and pointwise regions like a built-in pointwise op, with no new C++.
//
//   {"op": "hardshrink",                          the ATen base name
//    "inputs": ["self"],                          tensor arguments, schema positions 0..k-1
//    "params": [{"name": "lambd", "default": 0.5}],   numeric arguments at positions k, k+1, ...
//    "ssa": [{"id": 0, "op": "input", "index": 0},
//            {"id": 1, "op": "param", "index": 0},
//            {"id": 2, "op": "constant", "value": 0.0},
//            {"id": 3, "op": "abs", "args": [0]},
//            {"id": 4, "op": "gt", "args": [3, 1]},
//            {"id": 5, "op": "where", "args": [4, 0, 2]}]}   the last entry is the value
//
// Only names of the vocabulary and numbers pass: nothing of a lowering reaches generated code but
// function names the emitters already know and numeric literals they format themselves.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace fact::discover {

inline constexpr size_t kMaxLoweringSteps = 256;

// The lowering, checked and normalised (numbers as numbers, ids in order); UserError naming
// `where` and what is wrong otherwise.
nlohmann::json check_lowering(const nlohmann::json& doc, const std::string& where);

// Give every opaque node of `g` whose ATen op has a lowering in `lowerings` (checked documents)
// that lowering: the node becomes Op::lowered, planned as a pointwise op. A node whose arguments
// do not fit (a tensor where a number goes, an output that is not one floating tensor) stays
// opaque. Returns the op names applied.
std::vector<std::string> apply_lowerings(ir::Graph& g, const std::vector<nlohmann::json>& lowerings);

}  // namespace fact::discover
