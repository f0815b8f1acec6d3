// Pointwise regions' entry in the family table: the plan's search space and stage 2, one kernel
// per block shape, unranked. No rooted rule: the planner groups what the other rules left
// (discover::pointwise_regions, rule_pointwise.cpp).
#include "families/family.h"
#include "families/pointwise/pointwise.h"

namespace fact::families {

nlohmann::json pointwise_search_space(const discover::Match&, const std::string&) {
  // pointwise.h: 16-byte vectors of the last dim per thread
  return {{"block", {"128x4", "256x2", "256x4"}}};  // threads x vectors a thread
}

void realize_pointwise(RealizeStep& step) {
  try {
    const auto spec = realize::PointwiseSpec::from_pattern(*step.pattern);
    emit_every_config(step, spec, realize::pointwise_configs(spec), realize::emit_pointwise);
  } catch (const realize::NotSupported& e) {
    step.refuse(step.base, e.what());
  }
}

}  // namespace fact::families
