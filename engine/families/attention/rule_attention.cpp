// Attention: softmax(scale * Q @ K^T [+ causal mask | + additive bias]) @ V, written by hand or
// as scaled_dot_product_attention. The matcher steps over the views between the projections and
// the attention (split, view, transpose, GQA's expand/reshape or repeat_interleave) so the
// fused kernel reads Q, K and V in place, with the strides recorded in the plan.
#include <algorithm>
#include <cmath>
#include <limits>

#include "discover/catalog.h"
#include "discover/epilogue.h"
#include "discover/views.h"
#include "util/strings.h"

namespace fact::discover {

using ir::Arg;
using ir::Graph;
using ir::Node;
using ir::Op;
using ir::OpClass;

namespace {

// What a mask tensor says about position (i, j) of the score matrix.
enum class MaskKind { none, keep_lower, drop_upper, additive_upper };

bool is_neg_inf(double v) { return std::isinf(v) && v < 0; }

// A value that masks a score out of a softmax over `scores`: -inf, or that dtype's lowest finite
// value (torch.finfo(dtype).min, as Hugging Face's models write their masks): exp() of it less
// the row's maximum is zero either way.
bool masks_out(double v, ir::DType scores) {
  if (is_neg_inf(v)) return true;
  double lowest = -std::numeric_limits<float>::max();
  if (scores == ir::DType::bf16) lowest = -3.3895313892515355e38;
  if (scores == ir::DType::f16) lowest = -65504.0;
  if (scores == ir::DType::f64) lowest = -std::numeric_limits<double>::max();
  return v <= lowest * (1 - 1e-6);
}

// A constant the graph builds as a one-element tensor, torch.full([], v) (Hugging Face's score
// divisor and mask floor) or torch.tensor(v) (GPT-J's mask floor: a lifted constant whose value
// the trace recorded), behind identities; fills `v` and returns its node, or -1.
int constant_tensor(const Graph& g, int id, double& v) {
  const int c = skip_identity(g, id);
  const auto& n = g.node(c);
  if (n.op == Op::placeholder && n.outputs.size() == 1 && n.type().numel() == 1 && n.facts.count("value")) {
    v = n.facts.at("value");
    return c;
  }
  if (n.op != Op::full || n.outputs.size() != 1 || n.type().numel() != 1) return -1;
  const Arg* fill = n.arg(1, "fill_value");
  return fill && scalar_value(g, *fill, v) ? c : -1;
}

// Whether a view swaps the last two dims (a transposed mask is no causal mask).
bool swaps_last_two(const Node& n) {
  const int r = n.type().rank();
  if (n.op == Op::t || n.op == Op::mT || n.op == Op::numpy_T) return true;
  if (n.op == Op::transpose) {
    const Arg* d0 = n.arg(1, "dim0");
    const Arg* d1 = n.arg(2, "dim1");
    if (!d0 || !d1 || d0->kind != Arg::Kind::integer || d1->kind != Arg::Kind::integer) return true;
    const int a = norm_dim(d0->i, r), b = norm_dim(d1->i, r);
    return a != b && (a >= r - 2 || b >= r - 2);  // moves one of the two: not the same mask
  }
  if (n.op == Op::permute) {
    std::vector<int64_t> perm;
    if (!int_list(n.arg(1, "dims"), perm) || static_cast<int>(perm.size()) != r) return true;
    return r >= 2 && (norm_dim(perm[static_cast<size_t>(r - 2)], r) != r - 2 ||
                      norm_dim(perm[static_cast<size_t>(r - 1)], r) != r - 1);
  }
  return false;
}

// A logical not: logical_not, or ~ on a bool tensor (aten.bitwise_not, which the catalog leaves
// opaque since on integers it is no logical op).
bool is_logical_not(const Graph& g, const Node& n) {
  if (n.op == Op::logical_not) return true;
  const int src = first_operand(n);
  return n.op == Op::opaque && n.target_op.rfind("aten.bitwise_not.", 0) == 0 && src >= 0 &&
         g.node(src).outputs.size() == 1 && g.node(src).type().dtype == ir::DType::boolean &&
         n.outputs.size() == 1;
}

// Recognise causal masks through views, casts and slices that start at 0 (a view that moves
// the last two dims ends it: the mask then says something else). For an additive mask,
// `floor` (if given) gets the value it adds above the diagonal.
MaskKind mask_kind(const Graph& g, int id, std::vector<int>& nodes, double* floor = nullptr) {
  while (true) {
    const auto& n = g.node(id);
    const bool view_like = is_view(n) || is_identity(g, n) || ir::op_class(n.op) == OpClass::cast;
    if (!view_like) break;
    if (swaps_last_two(n)) return MaskKind::none;
    if (n.op == Op::slice) {
      const Arg* start = n.arg(2, "start");
      if (start && start->kind == Arg::Kind::integer && start->i != 0) return MaskKind::none;
    }
    nodes.push_back(id);
    id = first_operand(n);
  }
  const auto& n = g.node(id);
  if (n.is_placeholder()) {
    if (n.has_fact("tril") && n.facts.at("tril") != 0) return MaskKind::keep_lower;
    if (n.has_fact("causal_additive") && n.facts.at("causal_additive") != 0) {
      if (floor) *floor = -std::numeric_limits<double>::infinity();  // the tracer's fact: -inf
      return MaskKind::additive_upper;
    }
    return MaskKind::none;
  }
  nodes.push_back(id);
  double v = 0;
  switch (n.op) {
    case Op::eq:
    case Op::ne: {
      // (tril == 0) marks the upper triangle; (tril != 0) the lower one.
      const Arg* other = n.arg(1, "other");
      if (!other || !scalar_value(g, *other, v) || v != 0) return MaskKind::none;
      const auto inner = mask_kind(g, first_operand(n), nodes);
      if (inner != MaskKind::keep_lower) return MaskKind::none;
      return n.op == Op::eq ? MaskKind::drop_upper : MaskKind::keep_lower;
    }
    case Op::opaque:
    case Op::logical_not: {
      if (!is_logical_not(g, n)) return MaskKind::none;
      const auto inner = mask_kind(g, first_operand(n), nodes);
      if (inner == MaskKind::keep_lower) return MaskKind::drop_upper;
      if (inner == MaskKind::drop_upper) return MaskKind::keep_lower;
      return MaskKind::none;
    }
    case Op::tril:
    case Op::triu: {
      const Arg* diag = n.arg(1, "diagonal");
      const int64_t d = diag && diag->kind == Arg::Kind::integer ? diag->i : 0;
      const int src = first_operand(n);
      if (src < 0) return MaskKind::none;
      const auto& fill = g.node(src);
      double fill_value = 0;
      const bool is_full = fill.op == Op::full && fill.arg(1, "fill_value") &&
                           scalar_value(g, *fill.arg(1, "fill_value"), fill_value);
      // torch.full((s, s), finfo.min).triu(1) is an additive mask as -inf's is (Hugging Face's)
      const bool lowest = is_full && fill.outputs.size() == 1 && masks_out(fill_value, fill.type().dtype);
      const bool is_ones = fill.op == Op::ones || (is_full && fill_value != 0 && !lowest);
      if (!is_full && !is_ones) return MaskKind::none;
      nodes.push_back(src);
      if (n.op == Op::tril && d == 0 && is_ones) return MaskKind::keep_lower;
      if (n.op == Op::triu && d == 1 && is_ones) return MaskKind::drop_upper;
      if (n.op == Op::triu && d == 1 && lowest) {
        if (floor) *floor = fill_value;
        return MaskKind::additive_upper;
      }
      return MaskKind::none;
    }
    default:
      return MaskKind::none;
  }
}

struct Side {
  int source = -1;
  std::vector<int> chain;
  int repeat = 1;        // GQA: how many query heads share one KV head
  bool transposed = false;  // K^T: last two dims swapped on the way
  double factor = 1.0;      // constants Q or K was multiplied by on the way (scores_operand)
};

// Whether `n`'s output has the shape and strides of its first tensor operand's (one output).
bool keeps_layout(const Graph& g, const Node& n) {
  const int src = first_operand(n);
  if (src < 0 || g.node(src).outputs.size() != 1 || n.outputs.size() != 1) return false;
  const auto &in = g.node(src).type(), &out = n.type();
  return in.shape == out.shape && in.strides == out.strides;
}

// A multiply or divide of `n`'s one tensor operand by a constant that keeps its shape, strides
// and dtype (q_proj(x) * scaling, as CLIP's and BART's attention scale Q before the heads are
// split; a pointwise op keeps a dense input's strides): fills `c` with the factor.
bool layout_keeping_scale(const Graph& g, const Node& n, double& c) {
  if ((n.op != Op::mul && n.op != Op::div) || g.operands(n).size() != 1 || !keeps_layout(g, n)) return false;
  const Arg* by = n.arg(1, "other");
  double v = 0;
  if (!by || !scalar_value(g, *by, v)) {
    by = n.arg(0, "self");  // c * x
    if (n.op != Op::mul || !by || !scalar_value(g, *by, v)) return false;
  }
  if (g.node(first_operand(n)).type().dtype != n.type().dtype || (n.op == Op::div && v == 0)) return false;
  c = n.op == Op::mul ? v : 1.0 / v;
  return true;
}

// A cast of 16-bit floats to f32 that keeps its input's shape and strides (GPT-J's
// query.to(torch.float32) before Q @ K^T): the products of 16-bit values are exact in f32, so the
// fused kernel's 16-bit MMAs with f32 accumulation compute what the f32 product does.
bool layout_keeping_widening(const Graph& g, const Node& n) {
  if (ir::op_class(n.op) != OpClass::cast || !keeps_layout(g, n)) return false;
  const auto from = g.node(first_operand(n)).type().dtype;
  return (from == ir::DType::bf16 || from == ir::DType::f16) && n.type().dtype == ir::DType::f32;
}

// Walk a Q/K/V operand back to the tensor it reads, noting GQA expansion and transposes, and
// (`scores_operand`, for Q and K, not V) constant scales and widening casts read only on the way:
// softmax(c q k^T) is the attention of q and k with its scale times c.
Side trace_operand(const Graph& g, int id, bool scores_operand = false) {
  Side s;
  s.source = id;
  bool sole = true;  // every node so far has one reader: a scale on the way joins the pattern
  while (true) {
    const auto& n = g.node(s.source);
    const int src = first_operand(n);
    if (src < 0) break;
    sole = sole && n.users.size() == 1 && !g.is_graph_output(s.source);
    double c = 0;
    if (scores_operand && sole && layout_keeping_scale(g, n, c)) {
      s.factor *= c;
    } else if (scores_operand && sole && layout_keeping_widening(g, n)) {
      // the kernel reads the 16-bit values
    } else if (n.op == Op::repeat_interleave) {
      const Arg* r = n.arg(1, "repeats");
      if (!r || r->kind != Arg::Kind::integer) break;
      s.repeat *= static_cast<int>(r->i);
    } else if ((n.op == Op::expand || n.op == Op::expand_as) && n.outputs.size() == 1 &&
               g.node(src).outputs.size() == 1) {
      // [b, h_kv, 1, s, d] -> [b, h_kv, rep, s, d]
      const auto& in = g.node(src).type().shape;
      const auto& out = n.type().shape;
      if (in.size() == out.size()) {
        for (size_t d = 0; d < in.size(); ++d) {
          if (in[d] == 1 && out[d] > 1) s.repeat *= static_cast<int>(out[d]);
        }
      }
    } else if (n.op == Op::transpose) {
      std::vector<int64_t> dims;
      const Arg* d0 = n.arg(1, "dim0");
      const Arg* d1 = n.arg(2, "dim1");
      if (d0 && d1 && d0->kind == Arg::Kind::integer && d1->kind == Arg::Kind::integer) {
        const int r = n.type().rank();
        const int a = norm_dim(d0->i, r), b = norm_dim(d1->i, r);
        if (std::min(a, b) == r - 2 && std::max(a, b) == r - 1) s.transposed = !s.transposed;
      }
    } else if (n.op == Op::t || n.op == Op::mT || (n.op == Op::numpy_T && n.type().rank() == 2)) {
      s.transposed = !s.transposed;
    } else if (n.op == Op::numpy_T) {
      break;  // of a rank other than 2 it reverses every dim, not just the last two
    } else if (n.op == Op::permute) {
      std::vector<int64_t> perm;
      // The last two dims come out in the order opposite to the one they had: (0, 1, 3, 2),
      // and Whisper's K^T straight from (b, s, h, d), (0, 2, 3, 1).
      if (int_list(n.arg(1, "dims"), perm) && perm.size() >= 2) {
        const auto r = static_cast<int>(perm.size());
        if (norm_dim(perm[perm.size() - 2], r) > norm_dim(perm[perm.size() - 1], r)) s.transposed = !s.transposed;
      }
    } else if (!(is_view(n) || is_identity(g, n))) {
      break;  // a contiguous() that copies ends the walk: the kernel reads the copy
    }
    s.chain.push_back(s.source);
    s.source = src;
  }
  return s;
}

std::vector<int64_t> strides_of(const Graph& g, int id) {
  return g.node(id).outputs.size() == 1 ? g.node(id).type().strides : std::vector<int64_t>{};
}

// Fill in the parts shared by both attention rules.
Match attention_match(const Graph& g, const std::string& rule, int root, int q, int k, int v, int out,
                      bool causal, double scale, const std::string& softmax_dtype,
                      std::vector<int> nodes, std::vector<std::string> steps,
                      std::vector<std::vector<int>> chains) {
  const Side qs = trace_operand(g, q, true), ks = trace_operand(g, k, true), vs = trace_operand(g, v);
  if (qs.factor != 1.0 || ks.factor != 1.0) {
    scale *= qs.factor * ks.factor;
    if (std::find(steps.begin(), steps.end(), "scale") == steps.end()) steps.insert(steps.begin(), "scale");
  }
  const auto& qt = g.node(q).type();
  const auto& vt = g.node(v).type();
  const auto& ot = g.node(out).type();
  const int r = qt.rank();
  const int64_t seq_q = qt.shape[static_cast<size_t>(r - 2)];
  const int64_t head_dim = qt.shape[static_cast<size_t>(r - 1)];
  const int64_t seq_k = vt.shape[static_cast<size_t>(vt.rank() - 2)];
  const int64_t head_dim_v = vt.shape[static_cast<size_t>(vt.rank() - 1)];
  int64_t heads = r >= 4 ? qt.shape[static_cast<size_t>(r - 3)] : 1;
  int64_t batch = 1;
  for (int d = 0; d < r - (r >= 4 ? 3 : 2); ++d) batch *= qt.shape[static_cast<size_t>(d)];
  int64_t kv_heads = heads / std::max(ks.repeat, 1);
  if (ks.repeat == 1 && g.node(k).type().rank() >= 4) {
    const auto& kt = g.node(k).type();
    // SDPA with enable_gqa takes K with fewer heads directly; K^T keeps heads at rank-3.
    kv_heads = kt.shape[static_cast<size_t>(kt.rank() - 3)];
  }
  // K's strides as [.., s, d], whether the graph handed us K or K^T.
  auto k_strides = strides_of(g, k);
  if (ks.transposed && k_strides.size() >= 2) std::swap(k_strides[k_strides.size() - 1], k_strides[k_strides.size() - 2]);
  // Follow the output through transpose/contiguous/view to (b, s, h*d).
  const Chain tail = follow_views(g, out);
  for (int id : tail.nodes) nodes.push_back(id);
  const int final_out = tail.source;
  Match m;
  m.rule = rule;
  m.family = Family::attention;
  m.root = root;
  m.output = final_out;
  chains.push_back(qs.chain);
  chains.push_back(ks.chain);
  chains.push_back(vs.chain);
  absorb_chains(g, chains, nodes);
  m.nodes = nodes;
  normalize(m.nodes);
  m.anchors = {root};
  m.operands = {Operand{"q", qs.source, ""}, Operand{"k", ks.source, ""}, Operand{"v", vs.source, ""}};
  m.epilogue = std::move(steps);
  m.problem = {{"batch", batch},       {"heads", heads},   {"kv_heads", kv_heads},
               {"seq_q", seq_q},       {"seq_k", seq_k},   {"head_dim", head_dim},
               {"head_dim_v", head_dim_v}};
  const auto& final_t = g.node(final_out).type();
  m.attrs = {{"causal", causal},
             {"scale", scale},
             {"dtype", ir::dtype_name(g.node(qs.source).type().dtype)},  // what the kernel reads
             {"softmax_dtype", softmax_dtype},
             {"q_strides", strides_of(g, q)},
             {"k_strides", k_strides},
             {"v_strides", strides_of(g, v)},
             {"q_source", g.node(qs.source).name},
             {"k_source", g.node(ks.source).name},
             {"v_source", g.node(vs.source).name},
             {"out_layout", final_t.rank() == 3 && final_t.shape[2] == heads * head_dim_v ? "bs(hd)" : "bhsd"},
             {"out_dtype", ir::dtype_name(ot.dtype)}};
  return m;
}

// Which operand of an add (0 or 1) is an additive causal mask; -1 if neither. Fills `nodes`
// and, if given, `floor` (what the mask adds above the diagonal).
int additive_mask_side(const Graph& g, const std::vector<int>& ops, std::vector<int>& nodes,
                       double* floor = nullptr) {
  for (int side = 1; side >= 0; --side) {
    nodes.clear();
    if (mask_kind(g, ops[static_cast<size_t>(side)], nodes, floor) == MaskKind::additive_upper) return side;
  }
  nodes.clear();
  return -1;
}

// Whether `user` reads only the dtype of `id`: x.type_as(id) (T5 casts the probabilities back
// with .type_as(scores)).
bool reads_dtype_only(const Graph& g, int user, int id) {
  const auto ops = g.operands(g.node(user));
  return g.node(user).op == Op::type_as && ops.size() == 2 && ops[0] != id && ops[1] == id;
}

// One reader of `id`'s values; users that read only its dtype do not count.
bool single_use(const Graph& g, int id) {
  if (g.is_graph_output(id)) return false;
  const auto& users = g.node(id).users;
  return std::count_if(users.begin(), users.end(), [&](int u) { return !reads_dtype_only(g, u, id); }) == 1;
}

// The user of `id` that reads its values (see single_use).
int value_user(const Graph& g, int id) {
  for (int u : g.node(id).users) {
    if (!reads_dtype_only(g, u, id)) return u;
  }
  return -1;
}

// Whether `id` is a GEMM or computed from one within `depth` steps back.
bool reaches_gemm(const Graph& g, int id, int depth) {
  const auto& n = g.node(id);
  if (ir::op_class(n.op) == OpClass::gemm) return true;
  if (n.is_placeholder() || depth == 0) return false;
  for (int o : g.operands(n)) {
    if (reaches_gemm(g, o, depth - 1)) return true;
  }
  return false;
}

// Which operand of an add (0 or 1) is an additive score bias (a position bias, a padding mask
// made additive): a tensor that broadcasts to the scores and is not computed from Q @ K^T,
// while the other operand is; -1 if neither.
int score_bias_side(const Graph& g, const Node& add, const std::vector<int>& ops) {
  double alpha = 1.0;
  const Arg* a = add.arg(2, "alpha");
  if (add.outputs.size() != 1 || (a && a->kind != Arg::Kind::none && (!scalar_value(g, *a, alpha) || alpha != 1.0))) {
    return -1;  // scores + alpha * bias: SDPA's attn_mask is added as it is
  }
  const auto& scores = add.type().shape;
  for (int side = 1; side >= 0; --side) {
    const auto& b = g.node(ops[static_cast<size_t>(side)]);
    if (b.outputs.size() != 1 || b.type().rank() > static_cast<int>(scores.size())) continue;
    const auto& shape = b.type().shape;
    bool broadcasts = true;
    for (size_t d = 0; d < shape.size(); ++d) {
      const int64_t want = scores[scores.size() - shape.size() + d];
      broadcasts = broadcasts && (shape[d] == want || shape[d] == 1);
    }
    const int other = ops[static_cast<size_t>(1 - side)];
    // The scores themselves must not be broadcast up by the bias (SDPA's output keeps Q's rows).
    const bool scores_whole = g.node(other).outputs.size() == 1 && g.node(other).type().shape == scores;
    if (broadcasts && scores_whole && !reaches_gemm(g, b.id, 8) && reaches_gemm(g, other, 8)) return side;
  }
  return -1;
}

}  // namespace

Attempt match_attention_handwritten(const Graph& g, int root) {
  const std::string rule = "attention_handwritten";
  const auto& sm = g.node(root);
  const Arg* dim = sm.arg(1, "dim");
  if (!dim || dim->kind != Arg::Kind::integer || norm_dim(dim->i, sm.type().rank()) != sm.type().rank() - 1) {
    return miss(rule, root, root, 0, "softmax is not over the last dim");
  }
  std::vector<int> nodes = {root};
  std::vector<std::vector<int>> chains;  // mask computations, absorbed if nothing else reads them
  std::vector<std::string> steps;
  double scale = 1.0;
  bool causal = false;
  // What a masked score is by the softmax: the mask's floor (-inf, finfo.min) times any scale
  // after the mask. Where there is a bias too, masking it exactly as the graph does needs it.
  double floor = -std::numeric_limits<double>::infinity();
  int bias = -1;  // an additive score bias, added after any scale (as SDPA's attn_mask is)
  int progress = 1;
  // Backward: casts, scaling and masking between Q @ K^T and the softmax.
  int cur = first_operand(sm);
  while (ir::op_class(g.node(cur).op) != OpClass::gemm) {
    const auto& n = g.node(cur);
    if (!single_use(g, cur)) {
      return miss(rule, root, cur, progress, "'" + n.name + "' is also used outside the attention");
    }
    const auto ops = g.operands(n);
    double c = 0;
    std::vector<int> mask_nodes;
    if (ir::op_class(n.op) == OpClass::cast || is_identity(g, n)) {
      cur = first_operand(n);
    } else if ((n.op == Op::mul || n.op == Op::div) && ops.size() == 1 &&
               (scalar_value(g, *n.arg(1, "other"), c) || scalar_value(g, *n.arg(0, "self"), c))) {
      scale = n.op == Op::mul ? scale * c : scale / c;
      steps.insert(steps.begin(), "scale");  // walking backwards: earlier steps go first
      cur = ops[0];
    } else if ((n.op == Op::mul || n.op == Op::div) && ops.size() == 2 &&
               constant_tensor(g, ops[1], c) >= 0 && (n.op == Op::mul || c != 0)) {
      // scores / torch.full([], sqrt(d)): the constant's node goes with the pattern if nothing
      // else reads it
      scale = n.op == Op::mul ? scale * c : scale / c;
      steps.insert(steps.begin(), "scale");
      chains.push_back({constant_tensor(g, ops[1], c)});
      cur = ops[0];
    } else if (n.op == Op::masked_fill && ops.size() == 2 && n.arg(2, "value") &&
               scalar_value(g, *n.arg(2, "value"), c) && masks_out(c, n.type().dtype) &&
               mask_kind(g, ops[1], mask_nodes) == MaskKind::drop_upper) {
      causal = true;
      floor = c * scale;
      steps.insert(steps.begin(), "causal_mask");
      cur = ops[0];
    } else if (n.op == Op::where && ops.size() == 2 && n.arg(2, "other") &&
               scalar_value(g, *n.arg(2, "other"), c) && masks_out(c, n.type().dtype) &&
               mask_kind(g, ops[0], mask_nodes) == MaskKind::keep_lower) {
      causal = true;
      floor = c * scale;
      steps.insert(steps.begin(), "causal_mask");
      cur = ops[1];
    } else if (n.op == Op::where && ops.size() == 3 && constant_tensor(g, ops[2], c) >= 0 &&
               masks_out(c, n.type().dtype) && mask_kind(g, ops[0], mask_nodes) == MaskKind::keep_lower) {
      // torch.where(tril, scores, torch.full([], finfo.min)): Hugging Face's GPT-2
      causal = true;
      floor = c * scale;
      steps.insert(steps.begin(), "causal_mask");
      mask_nodes.push_back(constant_tensor(g, ops[2], c));
      cur = ops[1];
    } else if (n.op == Op::add && ops.size() == 2 && additive_mask_side(g, ops, mask_nodes) >= 0) {
      causal = true;
      cur = ops[static_cast<size_t>(1 - additive_mask_side(g, ops, mask_nodes, &c))];
      floor = c * scale;  // (s + floor) * scale: s is lost in floor's rounding
      steps.insert(steps.begin(), "causal_mask");
    } else if (n.op == Op::add && ops.size() == 2 && score_bias_side(g, n, ops) >= 0) {
      const int side = score_bias_side(g, n, ops);
      if (bias >= 0) return miss(rule, root, cur, progress, "a second score bias ('" + n.name + "')");
      if (std::find(steps.begin(), steps.end(), "scale") != steps.end()) {
        return miss(rule, root, cur, progress,
                    "the score bias '" + g.node(ops[static_cast<size_t>(side)]).name +
                        "' is added before a scale, which would scale it too");
      }
      bias = ops[static_cast<size_t>(side)];
      steps.insert(steps.begin(), "bias");
      cur = ops[static_cast<size_t>(1 - side)];
    } else {
      return miss(rule, root, cur, progress,
                  "between Q @ K^T and softmax, '" + n.name + "' (" + n.target_op +
                      ") is not a cast, a scale by a constant, a causal mask or an additive bias");
    }
    nodes.push_back(n.id);
    if (!mask_nodes.empty()) chains.push_back(mask_nodes);
    ++progress;
  }
  if (causal && !(floor < 0)) {  // -inf * -0.5 is +inf: eager's softmax is NaN there
    return miss(rule, root, root, progress, "a scale by a factor <= 0 after the causal mask unmasks it");
  }
  const int qk = cur;
  if (!single_use(g, qk)) return miss(rule, root, qk, progress, "the scores Q @ K^T are also used elsewhere");
  nodes.push_back(qk);
  const auto qk_ops = g.operands(g.node(qk));
  if (qk_ops.size() != 2) return miss(rule, root, qk, progress, "Q @ K^T does not have two tensor operands");
  int q = qk_ops[0];
  // A scale applied to Q before the product.
  {
    const auto& qn = g.node(q);
    double c = 0;
    const auto qops = g.operands(qn);
    if ((qn.op == Op::mul || qn.op == Op::div) && qops.size() == 1 && single_use(g, q) &&
        (scalar_value(g, *qn.arg(1, "other"), c) || scalar_value(g, *qn.arg(0, "self"), c))) {
      scale = qn.op == Op::mul ? scale * c : scale / c;
      steps.insert(steps.begin(), "scale");
      nodes.push_back(q);
      q = qops[0];
    }
  }
  const int kt = qk_ops[1];
  if (!trace_operand(g, kt, true).transposed) {
    return miss(rule, root, kt, progress, "the right operand of Q @ K^T is not a transposed K");
  }
  ++progress;
  // Forward: casts and dropout(p=0) to probs @ V.
  cur = root;
  std::string softmax_dtype = ir::dtype_name(sm.type().dtype);
  while (true) {
    if (!single_use(g, cur)) return miss(rule, root, cur, progress, "the probabilities are also used elsewhere");
    const int u = value_user(g, cur);
    const auto& n = g.node(u);
    if (ir::op_class(n.op) == OpClass::cast || is_identity(g, n)) {
      nodes.push_back(u);
      cur = u;
      continue;
    }
    if (n.op == Op::dropout) {
      return miss(rule, root, u, progress, "dropout with p > 0 in training mode is not fused");
    }
    if (ir::op_class(n.op) == OpClass::gemm && first_operand(n) == cur) {
      nodes.push_back(u);
      cur = u;
      break;
    }
    return miss(rule, root, u, progress,
                "after softmax, '" + n.name + "' (" + n.target_op + ") is not a cast, dropout or @ V");
  }
  const int pv = cur;
  const auto pv_ops = g.operands(g.node(pv));
  if (pv_ops.size() != 2) return miss(rule, root, pv, progress, "P @ V does not have two tensor operands");
  steps.push_back("softmax");
  // single_use let dtype-only readers pass: they must be inside the pattern too. And nothing
  // outside may read a node inside but P @ V's one reader (the views to the output).
  for (int id : nodes) {
    for (int u : g.node(id).users) {
      if (std::find(nodes.begin(), nodes.end(), u) != nodes.end() || value_user(g, id) == u) continue;
      return miss(rule, root, u, progress,
                  "'" + g.node(u).name + (reads_dtype_only(g, u, id) ? "' reads the dtype of '" : "' also reads '") +
                      g.node(id).name + "' inside the attention");
    }
  }
  Attempt a;
  a.matches.push_back(attention_match(g, rule, root, q, kt, pv_ops[1], pv, causal, scale, softmax_dtype,
                                      nodes, steps, chains));
  if (bias >= 0) {
    Match& m = a.matches.back();
    m.operands.push_back(Operand{"bias", bias, broadcast_kind(g.node(bias).type(), g.node(root).type())});
    m.attrs["bias_shape"] = g.node(bias).type().shape;
    m.attrs["bias_dtype"] = ir::dtype_name(g.node(bias).type().dtype);
    // A string: JSON has no -inf. SDPA's attn_mask must mask as the graph does, also in rows the
    // bias masks whole (a padded query's), where the graph's floor decides what the row sees.
    if (causal) m.attrs["mask_floor"] = format_double(floor);
  }
  return a;
}

Attempt match_attention_sdpa(const Graph& g, int root) {
  const std::string rule = "attention_sdpa";
  const auto& n = g.node(root);
  const Arg* q = n.arg(0, "query");
  const Arg* k = n.arg(1, "key");
  const Arg* v = n.arg(2, "value");
  if (!q || !k || !v || !q->is_node() || !k->is_node() || !v->is_node()) {
    return miss(rule, root, root, 0, "query, key and value are not all tensors");
  }
  std::vector<int> nodes = {root};
  std::vector<std::vector<int>> chains;
  std::vector<std::string> steps = {"scale"};
  bool causal = false;
  const Arg* is_causal = n.arg(5, "is_causal");
  if (is_causal && is_causal->kind == Arg::Kind::boolean) causal = is_causal->b;
  const Arg* mask = n.arg(3, "attn_mask");
  if (mask && mask->is_node()) {
    std::vector<int> mask_nodes;
    const auto kind = mask_kind(g, mask->node, mask_nodes);
    if (kind != MaskKind::keep_lower && kind != MaskKind::additive_upper) {
      return miss(rule, root, mask->node, 1, "attn_mask '" + g.node(mask->node).name + "' is not a causal mask");
    }
    causal = true;
    chains.push_back(mask_nodes);
  }
  if (causal) steps.push_back("causal_mask");
  steps.push_back("softmax");
  const Arg* dropout = n.arg(4, "dropout_p");
  double p = 0;
  if (dropout && scalar_value(g, *dropout, p) && p != 0) {
    return miss(rule, root, root, 1, "dropout_p > 0 is not fused");
  }
  const auto& qt = g.node(q->node).type();
  double scale = 1.0 / std::sqrt(static_cast<double>(qt.shape.back()));
  const Arg* s = n.arg(-1, "scale");
  if (s && s->kind != Arg::Kind::none) scalar_value(g, *s, scale);
  if (n.outputs.size() != 1) {
    return miss(rule, root, root, 1, "the backend variant returning several tensors is not handled");
  }
  Attempt a;
  a.matches.push_back(attention_match(g, rule, root, q->node, k->node, v->node, root, causal, scale,
                                      ir::dtype_name(qt.dtype), nodes, steps, chains));
  return a;
}

}  // namespace fact::discover
