// The matrix problem a GEMM-class node computes: out[batch, m, n] = A[batch, m, k] @ B[batch, k, n].
//
// Covers mm, addmm, bmm, baddbmm, linear and matmul (2-D, batched, broadcast), with operand
// layouts read off the strides (a transposed weight is a column-major B, not a copy). The op's
// own bias and alpha/beta come back as a seed expression for the epilogue.
#pragma once

#include <string>
#include <vector>

#include "discover/expr.h"
#include "discover/pattern.h"
#include "ir/graph.h"

namespace fact::discover {

struct GemmShape {
  int a = -1, b = -1;  // operand nodes as the GEMM reads them
  int64_t batch = 1, m = 0, n = 0, k = 0;
  std::string layout_a, layout_b;  // row | col | strided
  bool b_is_weight = false;        // B is a parameter, buffer or constant (seen through views)
  bool b_transposed_weight = false;  // B = W^T with W [n, k] (linear, or mm with t(W))
  ExprGraph seed;                  // acc, plus the op's own bias / alpha / beta
  std::vector<Operand> seed_operands;
};

// False (with `why`) when the node is not a matrix-matrix product FACT can express.
bool gemm_shape(const ir::Graph& g, int node, GemmShape& out, std::string& why);

// Layouts and dtypes of a GEMM-family match, for the plan.
nlohmann::json gemm_attrs(const ir::Graph& g, const GemmShape& s, int output);

// Layout of the last two dims of a tensor type: row | col | strided.
std::string matrix_layout(const ir::TensorType& t);

}  // namespace fact::discover
