#include "families/family.h"

#include "ir/error.h"

namespace fact::families {

using discover::Family;

const std::vector<FamilyEntry>& table() {
  static const std::vector<FamilyEntry> families = {
      {Family::gemm, gemm_rules, gemm_search_space, realize_gemm, gemm_plan_forms},
      {Family::horizontal_gemm, horizontal_gemm_rules, gemm_search_space, realize_gemm},
      {Family::gated_mlp, gated_mlp_rules, gemm_search_space, realize_gemm, gated_mlp_plan_forms},
      {Family::attention, attention_rules, attention_search_space, realize_attention},
      {Family::norm, norm_rules, norm_search_space, realize_norm},
      {Family::pointwise, nullptr, pointwise_search_space, realize_pointwise},
  };
  return families;
}

const FamilyEntry& family(Family id) {
  for (const auto& f : table()) {
    if (f.id == id) return f;
  }
  FACT_CHECK(false, std::string("no entry in the family table for ") + discover::family_name(id));
  return table().front();
}

}  // namespace fact::families
