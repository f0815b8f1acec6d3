// Human-readable renderings of the plan and of `explain` output.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>

namespace fact {

void print_plan(const nlohmann::json& plan, std::ostream& os);
void print_explain(const nlohmann::json& explanation, std::ostream& os);

}  // namespace fact
