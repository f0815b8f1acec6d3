// Row norms' entry in the family table: their rules, the plan's search space, and stage 2: one
// kernel per block shape, unranked.
#include "discover/catalog.h"
#include "families/family.h"
#include "families/norm/norm.h"

namespace fact::families {

using ir::Op;

std::vector<discover::Rule> norm_rules() {
  using discover::Family;
  return {
      {"norm", Family::norm, {Op::layer_norm, Op::native_layer_norm, Op::rms_norm},
       "y = (x - mean) * rstd * w + b  |  y = x * rsqrt(mean(x^2) + eps) * w  // one row pass",
       discover::match_norm_op},
      {"rms_norm_handwritten", Family::norm, {Op::mean},
       "y = cast(x * rsqrt(mean(x^2, -1) + eps)) * w  // hand-written RMSNorm, one row pass",
       discover::match_rms_norm_handwritten},
      {"layer_norm_handwritten", Family::norm, {Op::mean},
       "y = (x - u) / sqrt(mean((x - u)^2, -1) + eps) * w + b, u = mean(x, -1)  // one row pass",
       discover::match_layer_norm_handwritten},
  };
}

nlohmann::json norm_search_space(const discover::Match&, const std::string&) {
  return {{"rows_per_block", {1, 2, 4, 8}}, {"vector_bytes", {8, 16}}, {"threads", {128, 256, 512}}};
}

void realize_norm(RealizeStep& step) {
  try {
    const auto spec = realize::NormSpec::from_pattern(*step.pattern);
    emit_every_config(step, spec, realize::norm_configs(spec), realize::emit_norm);
  } catch (const realize::NotSupported& e) {
    step.refuse(step.base, e.what());
  }
}

}  // namespace fact::families
