// The tunable parameter space of each kernel family, per arch, read off CUTLASS's hierarchy:
// threadblock tile, cluster shape, kernel and epilogue schedules, stages, rasterisation and
// split-K / stream-K. Stage 1 reports these ranges in the plan; stage 2 enumerates them,
// filters invalid configs (logging why) and compiles the survivors.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "discover/pattern.h"

namespace fact::realize {

// Ranges to search for a match on `arch` (sm90 | sm80), as JSON lists per parameter.
nlohmann::json search_space(const discover::Match& m, const std::string& arch);

}  // namespace fact::realize
