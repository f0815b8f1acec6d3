// Fused attention's entry in the family table: its rules, the plan's search space, and stage 2:
// CUTLASS's Hopper FMHA (bf16, f16) or its sm80 kernel (f32, in the math the precision allows),
// one kernel per ranked config; the tuner verifies and times them against PyTorch's
// scaled_dot_product_attention.
#include "discover/catalog.h"
#include "families/attention/attention.h"
#include "families/family.h"

namespace fact::families {

using nlohmann::json;
using ir::Op;

std::vector<discover::Rule> attention_rules() {
  using discover::Family;
  return {
      {"attention_handwritten", Family::attention, {Op::softmax},
       "O = softmax(scale * Q @ K^T + causal mask) @ V  // flash attention, scores stay on chip",
       discover::match_attention_handwritten},
      {"attention_sdpa", Family::attention, {Op::sdpa, Op::sdpa_flash, Op::sdpa_efficient, Op::sdpa_cudnn},
       "O = scaled_dot_product_attention(Q, K, V)  // with strided Q/K/V and (b, s, h*d) output",
       discover::match_attention_sdpa},
  };
}

json attention_search_space(const discover::Match&, const std::string& arch) {
  if (arch == "sm90") {  // CUTLASS's Hopper FMHA (attention.h): what FACT emits and tunes
    return {{"block_q", {128}},
            {"block_kv", {64, 128}},
            {"kernel_schedule", {"cooperative", "pingpong"}},
            {"stages_kv", {3, 4, 5}},
            {"mainloop_locked", {false, true}}};
  }
  return {{"tile_q", {64, 128}}, {"tile_kv", {64, 128}}, {"stages", {2, 3}}};
}

void realize_attention(RealizeStep& step) {
  const auto& pattern = *step.pattern;
  try {
    const auto spec = realize::AttentionSpec::from_pattern(pattern);
    const auto cands = realize::attention_candidates(spec, pattern["signature"], pattern["problem"], step.arch,
                                                     step.candidates, step.registry, step.precision,
                                                     step.attention_configs);
    write_text_file(step.candidates_file, cands.to_json().dump(2));
    for (const auto& ranked : cands.ranked) {
      step.add_kernel(realize::emit_attention(spec, ranked.config), ranked.config.to_json());
    }
  } catch (const realize::NotSupported& e) {
    step.refuse(step.base, e.what());
  }
}

}  // namespace fact::families
