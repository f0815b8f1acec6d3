// Epilogue discovery: the pointwise tail a GEMM can compute before it stores its tile.
//
// Starting at a GEMM node, grow_epilogue takes every following pointwise, cast, identity or
// shape-only node whose other tensor operands are independent of the GEMM and broadcast as a
// scalar, a row vector (one value per output column, like a bias), a column vector (one per
// row) or a full tensor of the output's shape. It keeps the largest such region with a single
// exit, takes in the side computations of full operands made of vectors alone (an outer product
// such as mean * c1, which the epilogue computes from the vectors), translates it to an
// expression over `acc`, folds sub-expressions that compute a known
// activation (by value: a hand-written tanh GELU becomes gelu_tanh), and names the steps.
#pragma once

#include <string>
#include <vector>

#include "discover/expr.h"
#include "discover/pattern.h"
#include "ir/graph.h"

namespace fact::discover {

struct Epilogue {
  std::vector<int> nodes;         // graph nodes absorbed: side computations, then the tail in program order
  int output = -1;                // the node whose value is stored (the GEMM if nodes is empty)
  std::vector<Operand> operands;  // extra tensors the epilogue reads
  ExprGraph expr;                 // over acc and operands
  std::vector<std::string> steps; // named steps in order (bias, scale, residual, gelu_tanh, ...)
  std::vector<std::string> stops; // why the region did not grow further, one line per frontier
  std::string text() const;       // "gelu_tanh(acc + bias)"
};

// `seed` holds steps the GEMM op itself performs (linear's or addmm's bias, alpha/beta),
// already expressed over acc (it may be just {acc}). With `taken` (a value per node), the tail
// stops before the nodes marked 1 (another pattern computes them) and kSecondFull (they read a
// second full-size tensor).
constexpr char kSecondFull = 2;
Epilogue grow_epilogue(const ir::Graph& g, int gemm, ExprGraph seed, std::vector<Operand> seed_operands,
                       const std::vector<char>* taken = nullptr);

// Classify how tensor `operand` broadcasts into a node whose output type is `out`:
// scalar | row | col | full, or "" if none of those.
std::string broadcast_kind(const ir::TensorType& operand, const ir::TensorType& out);

// Side computations of the epilogue of `gemm` over `region` (a flag per node, the GEMM's
// included; `down` flags the nodes that depend on the GEMM): nodes outside it whose full-shaped values the region reads but which are
// pointwise functions of dense scalars, row and column vectors only (an outer product such as
// mean * c1), read nowhere else. Sorted; the epilogue computes them from the vectors.
std::vector<int> side_computations(const ir::Graph& g, int gemm, const std::vector<char>& region,
                                   const std::vector<char>& down);
// The region node that reads side node `node` (directly or through other side nodes).
int side_reader(const ir::Graph& g, const std::vector<char>& region, const std::vector<int>& side, int node);

// Fold activation sub-expressions and name the steps (exposed for tests).
void fold_activations(ExprGraph& e);
std::vector<std::string> name_steps(const ir::Graph& g, const ExprGraph& e,
                                    const std::vector<Operand>& operands);

// If the nodes strictly between `input` and `output` (plus `output`) form a single-input
// pointwise function of `input` that computes a known activation, return its name (and the
// nodes); otherwise "". Used by the gated-MLP rule.
std::string activation_between(const ir::Graph& g, int input, int output, std::vector<int>& nodes);

}  // namespace fact::discover
