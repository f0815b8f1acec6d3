#include "discover/catalog.h"

#include <algorithm>

namespace fact::discover {

using ir::Op;

const char* family_name(Family f) {
  switch (f) {
    case Family::gemm: return "gemm";
    case Family::horizontal_gemm: return "horizontal_gemm";
    case Family::gated_mlp: return "gated_mlp";
    case Family::attention: return "attention";
    case Family::norm: return "norm";
    case Family::pointwise: return "pointwise";
  }
  return "?";
}

const std::vector<Rule>& catalog() {
  static const std::vector<Rule> rules = {
      {"gemm_epilogue", Family::gemm, {Op::mm, Op::addmm, Op::bmm, Op::baddbmm, Op::matmul, Op::linear},
       "D = epilogue(A @ B, operands...)  // any pointwise tail over the accumulator",
       match_gemm_epilogue, shrink_gemm_epilogue},
      {"horizontal_gemm", Family::horizontal_gemm, {Op::mm, Op::addmm, Op::matmul, Op::linear},
       "[D1 | D2 | ...] = A @ [B1 | B2 | ...] (+ biases)  // GEMMs sharing A, one launch",
       match_horizontal_gemm},
      {"gated_mlp", Family::gated_mlp, {Op::mul},
       "D = act(A @ B1) * (A @ B2)  // SwiGLU / GeGLU, one GEMM over [B1 | B2]", match_gated_mlp},
      {"attention_handwritten", Family::attention, {Op::softmax},
       "O = softmax(scale * Q @ K^T + causal mask) @ V  // flash attention, scores stay on chip",
       match_attention_handwritten},
      {"attention_sdpa", Family::attention, {Op::sdpa, Op::sdpa_flash, Op::sdpa_efficient, Op::sdpa_cudnn},
       "O = scaled_dot_product_attention(Q, K, V)  // with strided Q/K/V and (b, s, h*d) output",
       match_attention_sdpa},
      {"norm", Family::norm, {Op::layer_norm, Op::native_layer_norm, Op::rms_norm},
       "y = (x - mean) * rstd * w + b  |  y = x * rsqrt(mean(x^2) + eps) * w  // one row pass",
       match_norm_op},
      {"rms_norm_handwritten", Family::norm, {Op::mean},
       "y = cast(x * rsqrt(mean(x^2, -1) + eps)) * w  // hand-written RMSNorm, one row pass",
       match_rms_norm_handwritten},
      {"layer_norm_handwritten", Family::norm, {Op::mean},
       "y = (x - u) / sqrt(mean((x - u)^2, -1) + eps) * w + b, u = mean(x, -1)  // one row pass",
       match_layer_norm_handwritten},
  };
  return rules;
}

Attempt miss(const std::string& rule, int root, int at, int progress, const std::string& reason) {
  Attempt a;
  a.misses.push_back(Miss{rule, root, at, progress, reason});
  return a;
}

void normalize(std::vector<int>& nodes) {
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
}

void absorb_chains(const ir::Graph& g, const std::vector<std::vector<int>>& chains,
                   std::vector<int>& nodes) {
  normalize(nodes);
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& chain : chains) {
      for (int id : chain) {
        if (std::binary_search(nodes.begin(), nodes.end(), id)) continue;
        bool all_users_in = !g.is_graph_output(id);
        for (int u : g.node(id).users) {
          all_users_in = all_users_in && std::binary_search(nodes.begin(), nodes.end(), u);
        }
        if (!all_users_in) break;
        nodes.push_back(id);
        normalize(nodes);
        changed = true;
      }
    }
  }
}

}  // namespace fact::discover
