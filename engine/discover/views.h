// Seeing through data-layout ops: the matchers ask "which tensor does this view read, and how".
//
// A view chain (view, reshape, permute, transpose, unsqueeze, expand, slice, split/getitem, ...)
// moves no data; identity ops (dropout in eval, alias, clone, contiguous of a contiguous tensor,
// casts to the same dtype) compute nothing. Rules step over both and record what they crossed,
// so the fused kernel can read the producer's memory in place.
#pragma once

#include <vector>

#include "ir/graph.h"

namespace fact::discover {

// True if `n` returns its input unchanged in value (dropout with p=0 or in eval mode, alias,
// detach, clone, contiguous, a cast to the dtype it already has).
bool is_identity(const ir::Graph& g, const ir::Node& n);
// True if `n` only changes the shape/strides of its first tensor operand.
bool is_view(const ir::Node& n);
// The first tensor operand of `n` (-1 if none).
int first_operand(const ir::Node& n);

struct Chain {
  int source = -1;         // the node whose memory is finally read
  std::vector<int> nodes;  // the view/identity nodes crossed, nearest first
};
// Walk back from `id` through views and identities (and casts, when allow_casts).
Chain see_through(const ir::Graph& g, int id, bool allow_casts = false);
// Walk back through identities only (no shape change).
int skip_identity(const ir::Graph& g, int id);
// Follow `id` forward while it has exactly one user that is a view or identity.
Chain follow_views(const ir::Graph& g, int id);

// Scalar value of an argument: a number, or a one-element constant with a "value" fact.
bool scalar_value(const ir::Graph& g, const ir::Arg& a, double& out);
// Integer list argument (shape, dims); false if not a list of integers.
bool int_list(const ir::Arg* a, std::vector<int64_t>& out);
// Normalise a possibly negative dim.
int norm_dim(int64_t dim, int rank);

}  // namespace fact::discover
