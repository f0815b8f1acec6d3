// Pointwise expressions: what a GEMM epilogue computes, as a DAG over the accumulator.
//
// An epilogue is stored in SSA form: each Expr reads earlier Exprs by index. Leaves are the
// accumulator (`acc`), extra tensor operands (`operand`, with a broadcast kind) and constants.
// Functions are named ("add", "gelu_tanh", "leaky_relu") with numeric parameters, so stage 2
// can compile any composition to an epilogue visitor tree, and the evaluator below can run it on
// sample points to recognise an activation however it was written.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace fact::discover {

struct Expr {
  enum class Kind { acc, operand, constant, fn };
  Kind kind = Kind::fn;
  std::string fn;              // Kind::fn: function name (see kFunctions in expr.cpp)
  std::vector<int> args;       // Kind::fn: indices of earlier Exprs
  std::vector<double> params;  // Kind::fn: numeric parameters (slope, bounds, exponent)
  double value = 0;            // Kind::constant
  int operand = -1;            // Kind::operand: index into the epilogue's operand list
  std::string dtype;           // fn "cast": the dtype it converts to
  std::vector<int> nodes;      // graph nodes this Expr stands for (several once folded)
  bool folded = false;         // a recognised activation standing for a sub-expression
};

struct ExprGraph {
  std::vector<Expr> exprs;  // SSA order
  int root = -1;

  int add(Expr e);
  // Drop expressions the root does not use, keeping SSA order.
  void compact();
  nlohmann::json to_json() const;
  static ExprGraph from_json(const nlohmann::json& ssa);  // the inverse of to_json
  std::string to_text(const std::vector<std::string>& operand_names) const;
};

// Is `fn` a function the evaluator and stage 2 know?
bool known_function(const std::string& fn);
// Its number of arguments; -1 for a name outside the vocabulary.
int function_arity(const std::string& fn);
// Evaluate one function on scalar arguments.
double eval_function(const std::string& fn, const std::vector<double>& args,
                     const std::vector<double>& params);
// Evaluate a sub-DAG: exprs[`output`] as a function of exprs[`input`] = x (all other leaves
// must be constants). Returns nullopt if something else feeds it.
std::optional<double> eval_unary(const ExprGraph& g, int input, int output, double x);

// Recognise a single-input function by value on sample points: "gelu_tanh", "silu", "mish", ...
// Returns "" when it is none of the known activations.
std::string fingerprint_activation(const ExprGraph& g, int input, int output);

// Translate one pointwise or cast graph node into an Expr; `expr_of` gives the Expr of each
// tensor operand (already translated). False (with `why`) when the node is outside the vocabulary.
bool node_to_expr(const ir::Graph& g, const ir::Node& n, const std::function<int(int)>& expr_of,
                  ExprGraph& out, int& result, std::string& why);

}  // namespace fact::discover
