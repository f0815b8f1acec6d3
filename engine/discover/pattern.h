// What a rule produces: a Match (a subgraph one fused kernel can compute) or a Miss (why not).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fact::discover {

// Kernel families, in the order stage 2 realizes them.
enum class Family { gemm, horizontal_gemm, gated_mlp, attention, norm, pointwise };
const char* family_name(Family f);

// A tensor the fused kernel reads that is produced outside the pattern.
struct Operand {
  std::string role;       // "a", "b", "bias", "residual", "q", "k", "v", "x", "weight", ...
  int node = -1;          // producing node
  std::string broadcast;  // epilogue operands: scalar | row | col | full; "" otherwise
};

struct Match {
  std::string rule;             // catalog entry that produced it
  Family family = Family::gemm;
  int root = -1;                // the node the rule was tried at
  std::vector<int> nodes;       // every node the fused kernel replaces, sorted
  std::vector<int> anchors;     // the heavy nodes (GEMMs, softmax, norm op), for reports
  int output = -1;              // the node whose value the kernel produces
  std::vector<Operand> operands;
  std::vector<std::string> epilogue;  // fused steps in order (named per the --json contract)
  nlohmann::json epilogue_expr;       // gemm families, pointwise: SSA form of the expression (see expr.h)
  nlohmann::json problem;             // sizes: m, n, k, batch / batch, heads, seq_q, ...
  nlohmann::json attrs;               // dtypes, layouts, causal, scale, eps, ...
};

struct Miss {
  std::string rule;
  int root = -1;
  int at = -1;       // the node where matching stopped (may differ from root)
  int progress = 0;  // how many steps matched before it stopped: ranks the nearest misses
  std::string reason;
};

// A rule either matches at a root or says why not.
struct Attempt {
  std::vector<Match> matches;  // usually zero or one
  std::vector<Miss> misses;
};

}  // namespace fact::discover
