#include "families/gemm/candidates.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "discover/cost_model.h"
#include "ir/error.h"
#include "ir/graph.h"
#include "families/gemm/emit.h"
#include "util/strings.h"

namespace fact::realize {

using discover::Family;
using nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------------------
// Small helpers

std::string fmt(double v, int precision = 3) {
  std::ostringstream s;
  s.precision(precision);
  s << v;
  return s.str();
}

std::string kb(int64_t bytes) { return fmt(static_cast<double>(bytes) / 1024.0, 4) + " KB"; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Element size in bytes; 0 for a dtype name FACT does not know.
int bytes_of(const std::string& dtype) {
  const auto d = ir::dtype_from_name(dtype);
  return d ? ir::dtype_bytes(*d) : 0;
}

bool is_16bit_float(const std::string& d) { return d == "bf16" || d == "f16"; }
bool is_8bit_float(const std::string& d) { return d == "f8e4m3" || d == "f8e5m2"; }

std::string tile_str(const GemmConfig& c) {
  return std::to_string(c.tile_m) + "x" + std::to_string(c.tile_n) + "x" + std::to_string(c.tile_k);
}

// Threads that hold accumulators for one tile. Cooperative: both consumer warpgroups share a
// tile (split along M), 256 threads. Pingpong: each consumer warpgroup owns a whole tile (the two
// alternate between mainloop and epilogue), 128 threads.
int mma_threads(const GemmConfig& c) { return c.kernel_schedule == "cooperative" ? 256 : 128; }

// Registers an MMA thread needs besides accumulators: A/B smem descriptors, pipeline state,
// addresses, loop counters and the epilogue's fragment of converted outputs. 40 is a round
// figure that reproduces CUTLASS's practice: 128 accumulators per thread build (256x128
// cooperative, 128x128 and 64x256 pingpong), 256 never do (they exceed the 255-register
// hardware limit on their own).
constexpr int kNonAccumulatorRegisters = 40;
constexpr int kMaxAccumulatorsPerThread = kSm90ConsumerRegisters - kNonAccumulatorRegisters;  // 192

// Epilogue staging tile: CUTLASS's EpilogueTileAuto on sm90 is 128 x 32 for cooperative kernels
// (one subtile spans both warpgroups) and 64 x 32 for pingpong (one warpgroup), clamped to the
// CTA tile.
int64_t epilogue_tile_elems(const GemmConfig& c) {
  const int64_t em = std::min(c.tile_m, c.kernel_schedule == "cooperative" ? 128 : 64);
  const int64_t en = std::min(c.tile_n, 32);
  return em * en;
}

// Shared memory CUTLASS keeps besides the mainloop stages and the epilogue buffers: epilogue
// pipeline barriers, the tile scheduler's storage, row/column broadcast buffers of the epilogue
// visitor tree (a bias row is tile_n elements). 1 KB is a generous round figure.
constexpr int64_t kMiscSmemBytes = 1024;

// Efficiency priors of the ranking model (not measurements; the registry overrides them).
// Tile efficiency rises with the tile's operand reuse, tile_m*tile_n/(tile_m+tile_n): 256x128
// (85.3) is taken as fully efficient, 64x64 (32) reaches 69%.
constexpr double kReuseFull = 256.0 * 128.0 / (256.0 + 128.0);
// The epilogue. A cooperative kernel's two warpgroups store a tile together after its mainloop,
// the tensor cores idle meanwhile: its tile takes mainloop + epilogue. A pingpong kernel's
// warpgroups alternate, one storing while the other runs its mainloop: its tile takes the longer
// of the two. The epilogue is taken as bound by the SM's share of device bandwidth for the
// output tile (and the source tile it reads, for a residual). The same model for every dtype:
// it orders the measured cooperative 128x256 vs pingpong 128x128 pairs as the H200 did (bf16
// and TF32, K 768 to 4096; see the test
// Candidates.EpilogueModelOrdersTheMeasuredPairsAsTheH200Did).
// Stages. A stage is refilled only once the MMAs that read it have retired, one K block after
// they were issued; so of S stages, S - 1 loads overlap a stage's MMAs plus the load's latency:
// a K block takes max(t_stage, (t_stage + latency) / (S - 1)). The latency is a fit: on the H200
// bf16 2-stage kernels (128x256x128 and 256x128x128, 1.4 us a stage) ran 1.39x and 1.56x their
// 64-deep 4-stage variants, and a 3-stage TF32 128x256x32 kernel (0.7 us a stage) ran at full
// speed (data/registry_seed.json, bench/results/2026-12-01-tf32-pingpong/).
constexpr double kLoadLatency = 0.6e-6;
// TMA multicast across a cluster cuts L2->SM traffic: each CTA loads its A tile / cluster_n and its
// B tile / cluster_m. The gain grows with the share of loads saved, up to x1.06 were all of them
// saved; so a 256x128 tile favours a 1x2 cluster (x1.02) over 2x1 (x1.01), as measured on the H200
// (bench/results/2026-11-30-clusters/).
constexpr double kClusterGainMax = 0.06;
// H200 L2: 60 MB (50 MB usable for operand reuse, a rule of thumb).
constexpr double kL2Bytes = 50e6;
// Stream-K: each CTA's share of the split tiles' K iterations spans a few tiles, and for each it
// writes or reads a partial fp32 accumulator tile through a global workspace (the fixup). The
// model charges every such tile twice its accumulator bytes at the CTA's share of the memory
// bandwidth. On the H200 the forced stream-K decomposition of a 4096^3 bf16 GEMM in 128x256
// tiles (248 split tiles over 132 SMs, about 3 partial tiles an SM) ran 193.6 us against 180.1
// for 4 data-parallel waves (bench/results/2026-12-02-decomposition/): the fixup cost about 20 us,
// where the 0.10-of-the-work rule it replaces said 8.
constexpr double kStreamKFixupTraffic = 2.0;
// The stream-K scheduler itself (its work assignment, the workspace's barriers) costs about 2 %
// even where it runs every tile data-parallel: 183.2 against 180.1 us (bf16, 128x256 tiles) and
// 339.8 against 337.5 (TF32) on the same square GEMMs.
constexpr double kStreamKOverhead = 1.02;
// CUTLASS's fewest K iterations for one stream-K unit (min_iters_per_sk_unit_): tiles of no more
// run data-parallel, and the stream-K work goes to fewer units where it is scarce.
constexpr int64_t kStreamKMinIters = 8;
// Registry boosts: a config measured within 10% of the best on a problem counts as "measured
// well". Same problem: ranked as measured, ahead of unmeasured configs (scored at half the best
// estimate, scaled by the measured time over the best measured there); nearest problems: up to
// x0.7, fading with distance (summed |log2| of the size ratios). Measured clearly slower on the
// same problem: x1.5.
constexpr double kWellMeasured = 1.10, kExactBoost = 0.5, kNearBoost = 0.3, kExactSlow = 1.5;
static_assert(kExactBoost * kWellMeasured < 1.0 - kNearBoost,
              "configs measured well on the problem itself must rank ahead of near-problem boosts");

// sm80 multistage kernels, the 3xTF32 (fp32-accurate) GEMMs: mma.sync issues from ordinary
// warps and reaches a share of the WGMMA peak on Hopper; 0.6 is a prior (the registry overrides
// it). A thread holds the big and small TF32 halves of its A and B fragments besides its
// accumulators: CUTLASS's tile list for the math keeps 64 accumulators a thread (its 128x128x32
// kernel takes 248 registers; 64x64 warp tiles, 128 accumulators, spill 480-536 bytes a thread
// at 255 registers: ptxas of CUDA 13 for sm_90a). The register budget is taken as 232, and as
// many CTAs as registers and shared memory allow share an SM.
constexpr double kMmaSyncShare = 0.6;
constexpr int kMaxMultistageAccumulators = 64;
constexpr int64_t kMultistageRegisters = 232;
constexpr int64_t kRegistersPerSm = 65536;
constexpr int64_t kSm90SmemPerSm = 228 * 1024;

// A multistage kernel's shared memory: its stages of A and B tiles (f32); the epilogue reuses it.
int64_t multistage_smem_bytes(const GemmConfig& c) {
  return int64_t{std::max(c.stages, 1)} * (c.tile_m + c.tile_n) * c.tile_k * 4;
}

}  // namespace

int sm90_cluster_sms(int cluster_size) {
  if (cluster_size <= 2) return kSm90SmCount;
  if (cluster_size <= 8) return 120;
  return 112;
}

namespace {

double rate_per_sm(const GemmProblem& p, const GemmConfig& c) {
  const auto& hw = discover::hardware("sm90", "");
  double rate = hw.bf16_flops;
  if (is_8bit_float(p.dtype_a)) rate = 2 * hw.bf16_flops;
  if (p.dtype_a == "f32") rate = c.math == "3xtf32" ? hw.tf32_flops * kMmaSyncShare / 3 : hw.tf32_flops;
  return rate / kSm90SmCount;
}

// ---------------------------------------------------------------------------------------------
// Problem-level checks: when one fails, no config of this list can run on the problem.

std::vector<std::string> problem_violations(const GemmProblem& p) {
  std::vector<std::string> why;
  const int ba = bytes_of(p.dtype_a), bb = bytes_of(p.dtype_b), bo = bytes_of(p.dtype_out);
  const bool supported = is_16bit_float(p.dtype_a) || is_8bit_float(p.dtype_a) || p.dtype_a == "f32";
  if (!supported) {
    why.push_back("operand dtype " + p.dtype_a + " has no sm90 TMA/WGMMA GEMM in the candidate lists");
  } else if (p.dtype_b != p.dtype_a && !(is_8bit_float(p.dtype_a) && is_8bit_float(p.dtype_b))) {
    why.push_back("mixed operand dtypes " + p.dtype_a + " x " + p.dtype_b + " are not in the candidate lists");
  }
  if (bo == 0) why.push_back("output dtype " + p.dtype_out + " is unknown");
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.batch <= 0) {
    why.push_back("empty problem (m=" + std::to_string(p.m) + " n=" + std::to_string(p.n) +
                  " k=" + std::to_string(p.k) + " batch=" + std::to_string(p.batch) + ")");
    return why;
  }
  // TMA: the innermost dimension must be contiguous and every other stride a multiple of 16
  // bytes. Row-major A (m x k) has leading dimension k, column-major A has m; row-major B (k x n)
  // has n, column-major B has k; the output and any full epilogue source are row-major m x n.
  auto leading = [&](const char* what, const std::string& layout, int64_t row_ld, int64_t col_ld,
                     const char* row_dim, const char* col_dim, int bytes) {
    if (layout == "strided") {
      why.push_back(std::string(what) + " is strided (no unit-stride dimension): TMA needs a contiguous inner dimension");
      return;
    }
    if (bytes == 0) return;
    const bool row = layout != "col";
    const int64_t ld = row ? row_ld : col_ld;
    if ((ld * bytes) % 16 != 0) {
      why.push_back(std::string(what) + " is " + (row ? "row" : "column") + "-major with " +
                    (row ? row_dim : col_dim) + "=" + std::to_string(ld) + ": " + (row ? row_dim : col_dim) +
                    "*" + std::to_string(bytes) + " bytes is not a multiple of 16 (TMA and cp.async need 16-byte aligned leading dimensions)");
    }
  };
  leading("A", p.layout_a, p.k, p.m, "K", "M", ba);
  if (p.n_parts.empty()) {
    leading("B", p.layout_b, p.n, p.k, "N", "K", bb);
  } else {  // each part's B is its own tensor (a row-major one is k x n_p)
    for (size_t i = 0; i < p.n_parts.size(); ++i) {
      leading(("B part " + std::to_string(i)).c_str(), p.layout_b, p.n_parts[i], p.k, "N", "K", bb);
    }
  }
  if (p.n_parts.size() > kMaxGemmParts) {
    why.push_back(std::to_string(p.n_parts.size()) + " parts: a grouped kernel takes at most " +
                  std::to_string(kMaxGemmParts) + " (FACT_MAX_GEMM_PARTS)");
  }
  if (p.n_parts.empty()) {
    leading("the output", "row", p.n, p.n, "N", "N", bo);
  } else {
    for (size_t i = 0; i < p.n_parts.size(); ++i) {
      leading(("output part " + std::to_string(i)).c_str(), "row", p.n_parts[i], p.n_parts[i], "N", "N", bo);
    }
  }
  if (p.reads_source) leading("the epilogue source", "row", p.n, p.n, "N", "N", bo);
  return why;
}

// ---------------------------------------------------------------------------------------------
// Config-level checks.

// Both operands K-major: what FACT's TF32 WGMMA kernels read correctly.
bool tf32_k_major(const GemmProblem& p) { return p.layout_a == "row" && p.layout_b == "col"; }

// An sm80 multistage kernel (3xTF32): CUTLASS 2.x's threadblock tile, warps and stages.
std::vector<std::string> multistage_violations(const GemmProblem& p, const GemmConfig& c) {
  std::vector<std::string> why;
  if (p.dtype_a != "f32" || c.math != "3xtf32") {
    why.push_back("multistage (sm80) kernels are listed for f32 operands in 3xTF32 only, got " + p.dtype_a +
                  " in math " + c.math);
  }
  if (p.b_operands != 1) why.push_back("a multistage kernel multiplies one B operand");
  if (p.family == "horizontal_gemm") {
    why.push_back("no grouped (horizontal) form of the sm80 3xTF32 kernel: the parts stay PyTorch's GEMMs");
  }
  if (c.epilogue_schedule != "visitor" || c.tile_scheduler != "grid" || c.cluster_m != 1 || c.cluster_n != 1) {
    why.push_back("a multistage kernel takes the visitor epilogue, the grid scheduler and no cluster, got " +
                  c.epilogue_schedule + ", " + c.tile_scheduler + ", cluster " + std::to_string(c.cluster_m) + "x" +
                  std::to_string(c.cluster_n));
  }
  if (c.tile_k != 16 && c.tile_k != 32) {
    why.push_back("tile_k " + std::to_string(c.tile_k) + " is not 16 or 32 (two or four 8-deep TF32 MMAs)");
  }
  if (c.stages < 3) why.push_back("stages " + std::to_string(c.stages) + ": the cp.async multistage mainloop needs 3");
  const auto [wm, wn] = multistage_warps(c);
  if (c.tile_m <= 0 || c.tile_n <= 0 || c.tile_m % (16 * wm) != 0 || c.tile_n % (8 * wn) != 0) {
    why.push_back("tile " + tile_str(c) + " does not split into " + std::to_string(wm) + "x" + std::to_string(wn) +
                  " warp tiles of whole 16x8 MMAs");
  } else if (c.tile_m * c.tile_n / (32 * wm * wn) > kMaxMultistageAccumulators) {
    why.push_back("registers: a " + tile_str(c) + " tile on " + std::to_string(wm * wn) + " warps is " +
                  std::to_string(c.tile_m * c.tile_n / (32 * wm * wn)) + " accumulators a thread, over the " +
                  std::to_string(kMaxMultistageAccumulators) + " that leave room for 3xTF32's split fragments");
  }
  if (c.stages >= 3 && multistage_smem_bytes(c) > kSm90SmemPerCta) {
    why.push_back("shared memory: " + tile_str(c) + " needs " + kb(multistage_smem_bytes(c)) + " for " +
                  std::to_string(c.stages) + " stages, over the " + kb(kSm90SmemPerCta) + " a CTA gets");
  }
  return why;
}

std::vector<std::string> config_violations(const GemmProblem& p, const GemmConfig& c) {
  if (c.kernel_schedule == "multistage") return multistage_violations(p, c);
  std::vector<std::string> why;
  const int ba = bytes_of(p.dtype_a);
  const bool f32 = p.dtype_a == "f32";
  // Schedules come in fixed pairs: the cooperative epilogue expects both warpgroups, the plain TMA
  // epilogue one.
  if (c.kernel_schedule == "cooperative") {
    if (c.epilogue_schedule != "tma_cooperative") {
      why.push_back("cooperative kernel needs the tma_cooperative epilogue, got " + c.epilogue_schedule);
    }
    if (c.tile_m % 128 != 0) {
      why.push_back("cooperative splits tile_m over 2 consumer warpgroups of 64 rows: needs tile_m >= 128, got " +
                    std::to_string(c.tile_m));
    }
  } else if (c.kernel_schedule == "pingpong") {
    if (c.epilogue_schedule != "tma") {
      why.push_back("pingpong kernel needs the tma epilogue, got " + c.epilogue_schedule);
    }
    if (c.tile_m != 64 && c.tile_m != 128) {
      why.push_back("pingpong gives each tile to one consumer warpgroup: needs tile_m <= 128 (64 or 128), got " +
                    std::to_string(c.tile_m));
    }
    if (c.tile_scheduler == "stream_k") {
      // CUTLASS 4.2, sm90_gemm_tma_warpspecialized_pingpong.hpp: a static_assert (seen as a
      // compile error of every such candidate for the large-K benchmark).
      why.push_back("CUTLASS's pingpong kernel does not support the stream_k tile scheduler");
    }
  } else {
    why.push_back("unknown kernel schedule '" + c.kernel_schedule + "'");
  }
  const bool grouped = p.family == "horizontal_gemm";
  if (grouped && c.tile_scheduler != "group") {
    why.push_back("a horizontal GEMM runs CUTLASS's grouped (ptr-array) kernel, whose tile scheduler is group, not " +
                  c.tile_scheduler);
  } else if (!grouped && c.tile_scheduler == "group") {
    why.push_back("the group tile scheduler is for horizontal GEMMs (CUTLASS's grouped kernel)");
  } else if (!grouped && c.tile_scheduler != "persistent" && c.tile_scheduler != "stream_k") {
    why.push_back("unknown tile scheduler '" + c.tile_scheduler + "'");
  }
  // WGMMA: N is a multiple of 8 up to 256 (we keep multiples of 16); one K step is 32 bytes.
  if (c.tile_n <= 0 || c.tile_n > 256 || c.tile_n % 16 != 0) {
    why.push_back("tile_n " + std::to_string(c.tile_n) + " is not a WGMMA N (a multiple of 16 up to 256)");
  }
  if (c.tile_m <= 0 || c.tile_k <= 0 || (ba && (c.tile_k * ba) % 32 != 0)) {
    why.push_back("tile_k " + std::to_string(c.tile_k) + " is not a whole number of WGMMA K steps (32 bytes) for " +
                  p.dtype_a);
  }
  if (f32 && c.math != "tf32" && c.math != "3xtf32") {
    why.push_back("f32 operands need math tf32 or 3xtf32 on sm90 tensor cores, got " + c.math);
  }
  if (f32 && !tf32_k_major(p)) {
    // CUTLASS builds these (its builder transposes through registers), but on the H200 every
    // such kernel failed verification (bench run of 2026-11-30: rel err 1.41, unwritten outputs).
    why.push_back("TF32 WGMMA kernels need K-major operands (row A, col B), got " + p.layout_a + " A, " + p.layout_b +
                  " B");
  }
  if (!f32 && c.math != "default") why.push_back("math " + c.math + " applies to f32 operands only");
  // Clusters: each dimension 1, 2 or 4, at most 4 CTAs (all the lists need; the portable
  // hardware limit is 8).
  auto pow2 = [](int v) { return v == 1 || v == 2 || v == 4; };
  if (!pow2(c.cluster_m) || !pow2(c.cluster_n) || c.cluster_m * c.cluster_n > 4) {
    why.push_back("cluster " + std::to_string(c.cluster_m) + "x" + std::to_string(c.cluster_n) +
                  " is not 1, 2 or 4 per dimension with at most 4 CTAs");
  }
  // Registers: every accumulator is one fp32 register of an MMA thread.
  if (c.tile_m > 0 && c.tile_n > 0) {
    const int64_t accum = static_cast<int64_t>(p.b_operands) * c.tile_m * c.tile_n / mma_threads(c);
    if (accum > kMaxAccumulatorsPerThread) {
      why.push_back("registers: a " + std::to_string(c.tile_m) + "x" + std::to_string(c.tile_n) + " tile" +
                    (p.b_operands > 1 ? " (x" + std::to_string(p.b_operands) + " accumulators)" : std::string()) +
                    " on " + std::to_string(mma_threads(c)) + " MMA threads (" + c.kernel_schedule + ") is " +
                    std::to_string(accum) + " fp32 accumulators per thread, over the " +
                    std::to_string(kMaxAccumulatorsPerThread) + " that fit in " +
                    std::to_string(kSm90ConsumerRegisters) + " registers");
    }
  }
  // Shared memory (see smem_sm90 for the estimate).
  if (ba && c.tile_m > 0 && c.tile_n > 0 && c.tile_k > 0) {
    const auto s = smem_sm90(p, c);
    if (c.stages != 0 && c.stages < 2) {
      why.push_back("stages " + std::to_string(c.stages) + ": the TMA pipeline needs at least 2");
    } else if (c.stages == 0 && s.stages < 2) {
      why.push_back("shared memory: " + tile_str(c) + " needs " + kb(2 * s.stage_bytes + s.epilogue_bytes) +
                    " for 2 stages of " + kb(s.stage_bytes) + " plus " + kb(s.epilogue_bytes) +
                    " of epilogue, over the " + kb(kSm90SmemPerCta) + " a CTA gets");
    } else if (c.stages != 0 && s.total_bytes > kSm90SmemPerCta) {
      why.push_back("shared memory: " + tile_str(c) + " needs " + kb(s.total_bytes) + " for " +
                    std::to_string(c.stages) + " stages of " + kb(s.stage_bytes) + " plus " + kb(s.epilogue_bytes) +
                    " of epilogue, over the " + kb(kSm90SmemPerCta) + " a CTA gets");
    }
  }
  return why;
}

}  // namespace

// -----------------------------------------------------------------------------------------------

GemmProblem GemmProblem::from_match(const discover::Match& m) {
  GemmProblem p;
  p.family = discover::family_name(m.family);
  if (m.family != Family::gemm && m.family != Family::horizontal_gemm && m.family != Family::gated_mlp) {
    throw UserError("kernel candidates: family " + p.family + " is not a GEMM family (gemm, horizontal_gemm, gated_mlp)");
  }
  const auto& pr = m.problem;
  const auto& a = m.attrs;
  auto size = [&](const char* key, int64_t dflt) -> int64_t {
    if (!pr.contains(key)) {
      if (dflt >= 0) return dflt;
      throw UserError("kernel candidates: " + p.family + " match has no problem size '" + key + "'");
    }
    return pr.at(key).get<int64_t>();
  };
  auto attr = [&](const char* key, const char* dflt) -> std::string {
    if (a.contains(key) && a.at(key).is_string()) return a.at(key).get<std::string>();
    if (dflt) return dflt;
    throw UserError("kernel candidates: " + p.family + " match has no attribute '" + key + "'");
  };
  p.batch = size("batch", 1);
  p.m = size("m", -1);
  p.n = size("n", -1);
  p.k = size("k", -1);
  // No defaults: emission (GemmSpec::from_pattern) reads the same attributes strictly, and a
  // default here would rank configs for a problem other than the one emitted.
  p.dtype_a = attr("dtype_a", nullptr);
  p.dtype_b = attr("dtype_b", nullptr);
  p.dtype_out = attr("dtype_out", nullptr);
  p.layout_a = attr("layout_a", nullptr);
  p.layout_b = attr("layout_b", nullptr);
  // The gated kernel keeps gate and up products of a tile on chip (two B tiles per stage, two
  // accumulators) so that the epilogue can form act(gate) * up without a round trip.
  p.b_operands = m.family == Family::gated_mlp ? 2 : 1;
  if (pr.contains("n_parts") && pr["n_parts"].is_array()) {
    for (const auto& v : pr["n_parts"]) p.n_parts.push_back(v.get<int64_t>());
  }
  for (const auto& o : m.operands) {
    if (o.broadcast == "full") p.reads_source = true;
  }
  return p;
}

json GemmProblem::to_json() const {
  json j = {{"family", family},       {"batch", batch},         {"m", m},
            {"n", n},                 {"k", k},                 {"dtype_a", dtype_a},
            {"dtype_b", dtype_b},     {"dtype_out", dtype_out}, {"layout_a", layout_a},
            {"layout_b", layout_b},   {"b_operands", b_operands}, {"reads_source", reads_source}};
  if (!n_parts.empty()) j["n_parts"] = n_parts;
  return j;
}

// Shared-memory estimate, after CUTLASS 3.x's sm90 collectives:
//   mainloop stage = tile_m*tile_k*bytes_a + b_operands*tile_n*tile_k*bytes_b + 16
//                    (the stage's full and empty mbarriers, 8 bytes each);
//   epilogue       = 2 D buffers of the epilogue subtile (StagesD = 2), plus 2 C buffers when
//                    the epilogue reads a full source tensor, plus kMiscSmemBytes;
//   auto stages    = (227 KB - epilogue) / stage, as StageCountAutoCarveout computes it.
SmemEstimate smem_sm90(const GemmProblem& p, const GemmConfig& c) {
  SmemEstimate s;
  const int64_t ba = bytes_of(p.dtype_a), bb = bytes_of(p.dtype_b), bo = std::max(1, bytes_of(p.dtype_out));
  s.stage_bytes = int64_t{c.tile_m} * c.tile_k * ba + int64_t{p.b_operands} * c.tile_n * c.tile_k * bb + 16;
  const int64_t epi = epilogue_tile_elems(c) * bo;
  s.epilogue_bytes = 2 * epi + (p.reads_source ? 2 * epi : 0) + kMiscSmemBytes;
  s.stages = c.stages != 0 ? c.stages
                           : static_cast<int>(std::max<int64_t>(0, kSm90SmemPerCta - s.epilogue_bytes) /
                                              std::max<int64_t>(1, s.stage_bytes));
  s.total_bytes = s.stages * s.stage_bytes + s.epilogue_bytes;
  return s;
}

bool supports_candidates(const discover::Match& m, const std::string& arch) {
  return arch == "sm90" &&
         (m.family == Family::gemm || m.family == Family::horizontal_gemm || m.family == Family::gated_mlp);
}

// fp32-accurate GEMMs: CUTLASS has 3xTF32 for sm80 kernels only (no sm90 collective splits the
// operands), so f32 under "highest" lists sm80 multistage kernels, the tiles and stages
// CUTLASS's generator lists for that math (GenerateSM80_TensorOp_1688_fast_fp32_math).
std::vector<GemmConfig> enumerate_multistage() {
  static const int kTiles[][4] = {{128, 128, 16, 4}, {128, 128, 16, 3}, {256, 64, 16, 3}, {64, 256, 16, 3},
                                  {128, 64, 16, 4},  {64, 128, 16, 4},  {64, 64, 16, 3},  {128, 128, 32, 3},
                                  {256, 64, 32, 3},  {64, 256, 32, 3},  {128, 64, 32, 3}, {64, 128, 32, 3},
                                  {64, 64, 32, 3}};
  std::vector<GemmConfig> out;
  for (const auto& t : kTiles) {
    GemmConfig c;
    c.tile_m = t[0];
    c.tile_n = t[1];
    c.tile_k = t[2];
    c.stages = t[3];
    c.kernel_schedule = "multistage";
    c.epilogue_schedule = "visitor";
    c.tile_scheduler = "grid";
    c.math = "3xtf32";
    out.push_back(c);
  }
  return out;
}

// Output tiles along N: a horizontal GEMM's parts tile separately (each rounds up on its own).
// With `cluster_n`, the CTA columns launched: CUTLASS's group scheduler rounds each part's
// columns up to the cluster (a plain GEMM rounds the whole).
static int64_t tiles_along_n(const GemmProblem& p, const GemmConfig& c, int cluster_n = 1) {
  if (p.n_parts.empty()) return round_up(ceil_div(p.n, c.tile_n), cluster_n);
  int64_t tiles = 0;
  for (const int64_t n : p.n_parts) tiles += round_up(ceil_div(n, c.tile_n), cluster_n);
  return tiles;
}

// The CTAs an sm90 kernel launches for `p`: each grid dimension rounded up to the cluster
// (padding CTAs occupy SMs without doing work), times the batch.
static int64_t launched_ctas(const GemmProblem& p, const GemmConfig& c) {
  return round_up(ceil_div(p.m, c.tile_m), c.cluster_m) * tiles_along_n(p, c, c.cluster_n) *
         std::max<int64_t>(1, p.batch);
}

// The literal lists. Every tile shape is listed with both schedules, as CUTLASS's generator does
// before its own validity checks; the filter then removes (and logs) the pairs that cannot build,
// so the log shows why, say, 64-row cooperative tiles never appear.
std::vector<GemmConfig> enumerate_sm90(const GemmProblem& p, const std::string& precision) {
  if (p.dtype_a == "f32" && precision == "highest") return enumerate_multistage();
  static const int kTileMN[] = {64, 128, 256};
  static const int kCluster[][2] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}};
  static const char* kSchedules[][2] = {{"cooperative", "tma_cooperative"}, {"pingpong", "tma"}};
  std::vector<int> tile_k = {64, 128};  // 128 and 256 bytes of a 16-bit K row
  std::string math = "default";
  if (p.dtype_a == "f32") {
    tile_k = {32};  // 128 bytes: one 128B-swizzle row of tf32
    math = precision == "highest" ? "3xtf32" : "tf32";
  } else if (is_8bit_float(p.dtype_a)) {
    tile_k = {128};
  }
  // Stream-K earns its fixup cost when K dominates (few, long tiles) or a config's tiles leave
  // the last wave of SMs partly idle (the tuner's decomposition knob then shares the last two
  // waves' tiles out evenly); otherwise the plain persistent scheduler is listed alone.
  const bool long_k = p.k >= 8 * std::max(p.m, p.n);
  std::vector<GemmConfig> out;
  for (int tm : kTileMN) {
    for (int tn : kTileMN) {
      for (int tk : tile_k) {
        for (const auto& cl : kCluster) {
          for (const auto& sched : kSchedules) {
            GemmConfig c;
            c.tile_m = tm;
            c.tile_n = tn;
            c.tile_k = tk;
            c.cluster_m = cl[0];
            c.cluster_n = cl[1];
            c.kernel_schedule = sched[0];
            c.epilogue_schedule = sched[1];
            c.stages = 0;
            c.tile_scheduler = p.family == "horizontal_gemm" ? "group" : "persistent";
            c.math = math;
            out.push_back(c);
            if (p.family == "horizontal_gemm") continue;  // the grouped kernel: no stream-K form
            if (long_k || launched_ctas(p, c) % sm90_cluster_sms(cl[0] * cl[1]) != 0) {
              c.tile_scheduler = "stream_k";
              out.push_back(c);
            }
          }
        }
      }
    }
  }
  return out;
}

FilterResult filter_sm90(const GemmProblem& p, const std::vector<GemmConfig>& configs) {
  FilterResult r;
  const auto problem_why = problem_violations(p);
  for (const auto& c : configs) {
    std::vector<std::string> why = problem_why;
    const auto own = config_violations(p, c);
    why.insert(why.end(), own.begin(), own.end());
    if (why.empty()) {
      r.kept.push_back(c);
    } else {
      r.dropped.push_back({c, join(why, "; ")});
    }
  }
  return r;
}

// Stream-K tiles among `tiles` on `sms` CTAs, as CUTLASS decomposes them
// (tile_scheduler_params.h, get_num_sk_tiles): none when the tiles fill whole waves or a tile
// has no more than CUTLASS's minimum of K iterations for a stream-K unit, or, under
// its heuristic (`forced` false), when the last wave is at least half full; else the last two
// waves' worth (all tiles below two full waves), the others data-parallel. `forced` is the
// stream-K decomposition knob (LaunchKnobs::decomposition).
static int64_t stream_k_tiles(int64_t tiles, int64_t sms, int64_t k_iters, bool forced) {
  const int64_t full = tiles / sms, tail = tiles - full * sms;
  if (tail == 0 || k_iters <= kStreamKMinIters || (!forced && 2 * tail >= sms)) return 0;
  return tiles - (full > 1 ? full - 1 : 0) * sms;
}

// How many times A and B come from device memory (when they do not fit in L2), for rank_sm90.
// Data-parallel tiles of one wave run at once and walk through K together, so the tiles of a
// wave that share a row panel of A (or a column panel of B) read it once; the others find it in
// L2. A wave of W tiles rastered along M covers min(W, m-tiles) row panels and
// ceil(W / m-tiles) column panels, along N the other way round; the cheaper order is assumed (the
// tuner sweeps both). Stream-K workers of one tile cover different K ranges at the same time, so
// stream-K tiles (a share `sk_share` of all) read their own panels, shared only within a cluster
// (TMA multicast): A ceil(n-tiles / cluster_n) times, B ceil(m-tiles / cluster_m) times.
static std::pair<double, double> operand_reads(const GemmConfig& c, int64_t tiles_m, int64_t tiles_n,
                                               int64_t batch, int64_t sms, double sk_share) {
  const double own_a = static_cast<double>(ceil_div(tiles_n, c.cluster_n));
  const double own_b = static_cast<double>(ceil_div(tiles_m, c.cluster_m));
  double dp_a = 1.0, dp_b = 1.0;
  const int64_t per_batch = tiles_m * tiles_n;
  const int64_t wave = std::min(sms, per_batch * batch);
  if (wave < per_batch) {  // else a wave holds whole problems of the batch: each panel once
    const double waves = static_cast<double>(per_batch) / static_cast<double>(wave);
    const double rows = static_cast<double>(tiles_m), cols = static_cast<double>(tiles_n);
    // Along M: min(W, m-tiles) row panels of A and ceil(W / m-tiles) column panels of B a wave.
    const double m_a = waves * static_cast<double>(std::min(wave, tiles_m)) / rows;
    const double m_b = waves * static_cast<double>(ceil_div(wave, tiles_m)) / cols;
    const double n_a = waves * static_cast<double>(ceil_div(wave, tiles_n)) / rows;
    const double n_b = waves * static_cast<double>(std::min(wave, tiles_n)) / cols;
    // Weighted by the rows of A and columns of B they move.
    const double along_m = m_a * c.tile_m * rows + m_b * c.tile_n * cols;
    const double along_n = n_a * c.tile_m * rows + n_b * c.tile_n * cols;
    dp_a = std::max(1.0, along_m <= along_n ? m_a : n_a);
    dp_b = std::max(1.0, along_m <= along_n ? m_b : n_b);
  }
  return {(1.0 - sk_share) * dp_a + sk_share * own_a, (1.0 - sk_share) * dp_b + sk_share * own_b};
}

// A tile's efficiency prior from its operand reuse, tile_m*tile_n/(tile_m+tile_n) (see kReuseFull).
static double reuse_efficiency(double tile_m, double tile_n) {
  const double reuse = tile_m * tile_n / (tile_m + tile_n);
  return 0.5 + 0.5 * std::min(1.0, reuse / kReuseFull);
}

// How far a config's stages cover the loads' latency (see kLoadLatency): the factor a K block of
// `t_stage` seconds slows down by, said in `reasons` when it does. The filter drops configs with
// fewer than 2 stages; scored anyway, they count as 2.
static double stage_cover(double t_stage, int stages, std::vector<std::string>& reasons) {
  const int in_flight = std::max(1, stages - 1);
  const double cover = std::min(1.0, in_flight * t_stage / (t_stage + kLoadLatency));
  if (cover < 1.0) {
    reasons.push_back(std::to_string(stages) + " stages of " + fmt(t_stage * 1e6) +
                      " us do not cover the loads' latency (x" + fmt(cover) + ")");
  }
  return cover;
}

// A tile's epilogue in seconds: its output tile (and a residual's source tile), with `storing`
// CTAs sharing the device's bandwidth (all the SMs, or the grid's tiles if fewer).
static double epilogue_time(const GemmProblem& p, const GemmConfig& c, int64_t storing) {
  const double bytes = static_cast<double>(c.tile_m * c.tile_n * bytes_of(p.dtype_out)) * (p.reads_source ? 2.0 : 1.0);
  return bytes / (discover::hardware("sm90", "").bandwidth / static_cast<double>(storing));
}

// The operands' traffic in seconds: `t_memory` (each byte once) plus the re-reads of operands
// bigger than L2 (operand_reads) over `sms` CTAs at once; said in `reasons` when it weighs.
static double memory_time(const GemmProblem& p, const GemmConfig& c, int64_t sms, double sk_share, double t_memory,
                          double t_compute, std::vector<std::string>& reasons) {
  const auto& hw = discover::hardware("sm90", "");
  const int64_t batch = std::max<int64_t>(1, p.batch);
  const int64_t tiles_m = ceil_div(p.m, c.tile_m), tiles_n = tiles_along_n(p, c);
  const double a_bytes = static_cast<double>(batch * p.m * p.k * bytes_of(p.dtype_a));
  const double b_bytes = static_cast<double>(batch * p.b_operands * p.k * p.n * bytes_of(p.dtype_b));
  const auto [a_reads, b_reads] = operand_reads(c, tiles_m, tiles_n, batch, sms, sk_share);
  const double extra = (a_bytes > kL2Bytes ? a_bytes * (a_reads - 1) : 0.0) +
                       (b_bytes > kL2Bytes ? b_bytes * (b_reads - 1) : 0.0);
  const double t_mem = t_memory + extra / hw.bandwidth;
  if (extra > 0) reasons.push_back("operands beyond L2 re-read: A x" + fmt(a_reads) + ", B x" + fmt(b_reads));
  if (t_mem > t_compute) reasons.push_back("memory-bound: " + fmt(t_mem * 1e6) + " us of traffic");
  return t_mem;
}

// The wave model of an sm90 kernel:
//   tiles     = ceil(m/tile_m) x ceil(n/tile_n) x batch, each grid dimension rounded up to the
//               cluster (padding CTAs occupy SMs without doing work);
//   t_main    = flops of one tile / (per-SM peak x efficiency), efficiency = tile reuse x stage
//               count x cluster multicast (the priors above);
//   t_tile    = t_main + t_epilogue (cooperative) or max(t_main, t_epilogue) (pingpong), where
//               t_epilogue = the output tile's bytes (twice for a residual) / (bandwidth / 132);
//   SMs       = 132, or fewer where clusters of 4 or more CTAs cannot fill every GPC
//               (sm90_cluster_sms);
//   persistent: ceil(tiles / SMs) waves of t_tile;
//   stream_k  : as CUTLASS decomposes it (stream_k_tiles): the stream-K tiles' K iterations
//               spread evenly over the SMs, plus a fixup, after the data-parallel waves; all
//               data-parallel when the waves are whole; the scheduler's own overhead (+2%)
//               either way; where CUTLASS's heuristic runs a
//               partial last wave data-parallel, the faster of that and the forced stream-K
//               decomposition (a run-time knob the tuner sweeps);
//   memory    = the operands' bytes, where an operand bigger than L2 is read more than once
//               (operand_reads); re-reads of one that fits in L2 hit L2;
//   time      = max(that, memory / bandwidth).
// In seconds; `reasons` says what weighed.
static double model_sm90(const GemmProblem& p, const GemmConfig& c, double t_memory, std::vector<std::string>& reasons) {
  const int64_t batch = std::max<int64_t>(1, p.batch);
  const int64_t tiles_m = ceil_div(p.m, c.tile_m), tiles_n = tiles_along_n(p, c);
  const int64_t tiles = launched_ctas(p, c);
  const int64_t useful = tiles_m * tiles_n * batch;
  // Efficiency (a gated tile reuses its A tile for both B operands).
  double eff = reuse_efficiency(c.tile_m, static_cast<double>(p.b_operands) * c.tile_n);
  const double rate = rate_per_sm(p, c);
  const double flops_per_k = 2.0 * p.b_operands * c.tile_m * c.tile_n;  // a tile's flops per unit of K
  const int stages = smem_sm90(p, c).stages;
  eff *= stage_cover(flops_per_k * static_cast<double>(c.tile_k) / (rate * eff), stages, reasons);
  const int64_t sms = sm90_cluster_sms(c.cluster_m * c.cluster_n);
  if (c.cluster_m * c.cluster_n > 1) {
    const double loads = static_cast<double>(c.tile_m) / c.cluster_n + static_cast<double>(c.tile_n) / c.cluster_m;
    const double gain = 1.0 + kClusterGainMax * (1.0 - loads / (c.tile_m + c.tile_n));
    eff *= gain;
    reasons.push_back("cluster " + std::to_string(c.cluster_m) + "x" + std::to_string(c.cluster_n) +
                      ": TMA multicast (x" + fmt(gain) + ")" +
                      (sms < kSm90SmCount ? ", but only " + std::to_string(sms) + " of " +
                                                std::to_string(kSm90SmCount) + " SMs hold such clusters at once"
                                          : ""));
  }
  if (c.cluster_m > tiles_m || c.cluster_n > tiles_n) {
    reasons.push_back("cluster " + std::to_string(c.cluster_m) + "x" + std::to_string(c.cluster_n) + " over " +
                      std::to_string(tiles_m) + "x" + std::to_string(tiles_n) +
                      " tiles: padding CTAs idle in every cluster");
  }
  const double t_main = flops_per_k * static_cast<double>(p.k) / (rate * eff);
  const double t_epilogue = epilogue_time(p, c, std::min<int64_t>(sms, tiles));
  double t_tile = 0;
  if (c.kernel_schedule == "pingpong") {
    t_tile = std::max(t_main, t_epilogue);
    reasons.push_back("pingpong: the epilogue (" + fmt(t_epilogue * 1e6) + " us a tile) " +
                      (t_epilogue <= t_main ? "hides behind" : "outlasts") + " the other warpgroup's mainloop (" +
                      fmt(t_main * 1e6) + " us)");
  } else {
    t_tile = t_main + t_epilogue;
    reasons.push_back("cooperative: the epilogue (" + fmt(t_epilogue * 1e6) + " us a tile) follows the mainloop (" +
                      fmt(t_main * 1e6) + " us)");
  }
  const int64_t waves = ceil_div(tiles, sms);
  const int64_t last = tiles - (waves - 1) * sms;
  double t_compute = static_cast<double>(waves) * t_tile;
  if (c.tile_scheduler != "stream_k") {
    reasons.push_back(std::to_string(tiles) + " tiles: " + std::to_string(waves) + " wave" +
                      (waves > 1 ? "s" : "") + ", last " +
                      fmt(100.0 * static_cast<double>(last) / static_cast<double>(sms), 3) + "% full" +
                      (sms < kSm90SmCount ? " (" + std::to_string(sms) + " SMs)" : ""));
    // Operand re-reads (see above): what makes a long-K problem with few tiles favour wide
    // tiles and clusters that load each operand once.
    return std::max(t_compute, memory_time(p, c, sms, 0.0, t_memory, t_compute, reasons));
  }
  // Stream-K. The time of `n` stream-K tiles: their K iterations spread over the stream-K units
  // (the SMs, or fewer where each would get under CUTLASS's minimum of iterations) after the
  // data-parallel waves, plus the fixup: each unit's share spans ceil(share / K iterations a
  // tile) + 1 tiles at most, each a partial accumulator tile through the workspace. Stream-K
  // tiles read their own operand panels (operand_reads), so the memory side is part of the
  // choice below.
  const int64_t k_iters = std::max<int64_t>(1, ceil_div(p.k, c.tile_k));
  const double t_iter = t_tile / static_cast<double>(k_iters);
  const double partial_bytes = kStreamKFixupTraffic * 4.0 * static_cast<double>(p.b_operands * c.tile_m * c.tile_n);
  const double t_partial = partial_bytes / (discover::hardware("sm90", "").bandwidth / static_cast<double>(sms));
  struct Option {
    int64_t sk_tiles = 0, dp_waves = 0, sk_useful = 0, units = 0;
    double time = 0;
    std::vector<std::string> reasons;
  };
  auto option = [&](int64_t n) {
    Option o;
    o.sk_tiles = n;
    double t = t_compute;
    if (n > 0) {
      o.dp_waves = (tiles - n) / sms;
      o.sk_useful = std::max<int64_t>(0, useful - o.dp_waves * sms);
      o.units = std::clamp<int64_t>(o.sk_useful * k_iters / kStreamKMinIters, 1, sms);
      const int64_t share = ceil_div(o.sk_useful * k_iters, o.units);
      const int64_t partials = std::min(o.sk_useful, ceil_div(share, k_iters) + 1);
      t = static_cast<double>(o.dp_waves) * t_tile + static_cast<double>(share) * t_iter +
          static_cast<double>(partials) * t_partial;
    }
    t *= kStreamKOverhead;
    const double share = static_cast<double>(n) / static_cast<double>(std::max<int64_t>(1, tiles));
    o.time = std::max(t, memory_time(p, c, sms, share, t_memory, t, o.reasons));
    return o;
  };
  const int64_t heuristic = stream_k_tiles(tiles, sms, k_iters, false), forced = stream_k_tiles(tiles, sms, k_iters, true);
  Option best = option(heuristic);
  const bool knob = heuristic == 0 && forced > 0;
  if (knob) {
    Option f = option(forced);
    if (f.time < best.time) best = std::move(f);
  }
  if (best.sk_tiles == 0) {
    reasons.push_back("stream_k runs data-parallel here (" + std::to_string(tiles) + " tiles: " +
                      (forced == 0 ? "whole waves, or too few K iterations a tile to share)"
                                   : "a last wave at least half full, and forcing stream-K would cost more than the "
                                     "idle SMs)"));
  } else {
    reasons.push_back("stream_k" + std::string(knob ? " (decomposition knob: stream_k)" : "") + ": " +
                      std::to_string(best.sk_useful * k_iters) + " K iterations of " + std::to_string(best.sk_useful) +
                      " tiles over " + std::to_string(best.units) + " SMs, plus fixup" +
                      (best.dp_waves > 0 ? ", after " + std::to_string(best.dp_waves) + " data-parallel waves" : ""));
  }
  reasons.insert(reasons.end(), best.reasons.begin(), best.reasons.end());
  return best.time;
}

// The model of an sm80 multistage kernel (3xTF32), the same terms in their sm80 form: no
// clusters, no warp specialization (the epilogue follows the mainloop), a threadblock grid
// instead of persistent CTAs, and as many CTAs on an SM as shared memory and registers allow,
// each at its share of the SM's mma.sync rate (kMmaSyncShare of the WGMMA peak, a prior).
static double model_multistage(const GemmProblem& p, const GemmConfig& c, double t_memory, std::vector<std::string>& reasons) {
  const int64_t batch = std::max<int64_t>(1, p.batch);
  const int64_t tiles_m = ceil_div(p.m, c.tile_m), tiles_n = tiles_along_n(p, c);
  const int64_t tiles = tiles_m * tiles_n * batch;
  const auto [warps_m, warps_n] = multistage_warps(c);
  const int64_t threads = 32 * warps_m * warps_n;
  const int64_t smem = multistage_smem_bytes(c);
  const int64_t resident = std::max<int64_t>(1, std::min(kSm90SmemPerSm / (smem + 1024),
                                                         kRegistersPerSm / (threads * kMultistageRegisters)));
  double eff = reuse_efficiency(c.tile_m, c.tile_n);
  const double rate = rate_per_sm(p, c) / static_cast<double>(resident);  // one CTA's share
  const double flops_per_k = 2.0 * c.tile_m * c.tile_n;
  eff *= stage_cover(flops_per_k * c.tile_k / (rate * eff), c.stages, reasons);
  const double t_main = flops_per_k * static_cast<double>(p.k) / (rate * eff);
  const int64_t slots = kSm90SmCount * resident;
  const double t_epilogue = epilogue_time(p, c, std::min(slots, tiles));
  const int64_t waves = ceil_div(tiles, slots);
  const double t_compute = static_cast<double>(waves) * (t_main + t_epilogue);
  reasons.push_back("sm80 multistage (mma.sync, 3xTF32): " + std::to_string(resident) + " CTA" +
                    (resident > 1 ? "s" : "") + " of " + std::to_string(threads) + " threads and " + kb(smem) +
                    " a SM; " + std::to_string(tiles) + " tiles in " + std::to_string(waves) + " wave" +
                    (waves > 1 ? "s" : "") + "; the epilogue (" + fmt(t_epilogue * 1e6) +
                    " us a tile) follows the mainloop (" + fmt(t_main * 1e6) + " us)");
  return std::max(t_compute, memory_time(p, c, slots, 0.0, t_memory, t_compute, reasons));
}

std::vector<Ranked> rank_sm90(const GemmProblem& p, const std::vector<GemmConfig>& configs,
                              const std::vector<registry::Hit>& hits) {
  const auto& hw = discover::hardware("sm90", "");
  const int64_t batch = std::max<int64_t>(1, p.batch);
  const double bytes = static_cast<double>(batch) *
                       (static_cast<double>(p.m * p.k * bytes_of(p.dtype_a)) +
                        static_cast<double>(p.b_operands * p.k * p.n * bytes_of(p.dtype_b)) +
                        static_cast<double>(p.m * p.n * bytes_of(p.dtype_out)) * (p.reads_source ? 2 : 1));
  const double t_memory = bytes / hw.bandwidth;
  // Best measured time per problem, to tell "measured well" from "measured slow".
  std::map<std::string, double> best_at;
  for (const auto& h : hits) {
    const auto key = h.row.problem.dump();
    if (!best_at.count(key) || h.row.time_us < best_at[key]) best_at[key] = h.row.time_us;
  }
  std::vector<Ranked> out;
  std::vector<double> exact;  // per config: its best time measured on this problem, 0 if none
  for (const auto& c : configs) {
    Ranked r;
    r.config = c;
    // The model's estimate, then what the registry measured.
    r.est_us = (c.kernel_schedule == "multistage" ? model_multistage(p, c, t_memory, r.reasons)
                                                  : model_sm90(p, c, t_memory, r.reasons)) *
               1e6;
    r.score = r.est_us;
    // Registry: measurements of this very config. On this problem (exact), see below; on nearby
    // problems, the best-applying boost.
    double exact_us = 0.0;  // this config's best time on this problem, 0 when never measured
    double factor = 1.0;
    std::string why;
    for (const auto& h : hits) {
      if (!h.row.config.is_object() || h.row.config.value("name", std::string()) != c.name()) {
        // Rows may predate "name" in the config JSON: compare the parsed config.
        try {
          if (!(GemmConfig::from_json(h.row.config) == c)) continue;
        } catch (const nlohmann::json::exception&) {
          continue;
        }
      }
      if (h.distance == 0.0) {
        if (exact_us == 0.0 || h.row.time_us < exact_us) exact_us = h.row.time_us;
        continue;
      }
      const double best = best_at[h.row.problem.dump()];
      if (h.row.time_us > kWellMeasured * best) continue;
      const double f = 1.0 - kNearBoost / (1.0 + h.distance);
      if (f < factor) {
        factor = f;
        why = "registry: " + fmt(h.row.time_us) + " us measured (" + h.row.provenance + ") on a problem at distance " +
              fmt(h.distance) + ", within 10% of the best there (x" + fmt(factor) + ")";
      }
    }
    exact.push_back(exact_us);
    if (exact_us == 0.0 && factor != 1.0) {
      r.score *= factor;
      r.reasons.push_back(why);
    }
    out.push_back(std::move(r));
  }
  // Configs measured on this problem. The best of them calibrates the model (its measured time
  // over its estimate): "the best there" is the faster of that measurement and the best estimate
  // of a config not measured there, in measured units, so a lone slow measurement does not
  // outrank configs the model expects to be much faster (a config measured there is judged by
  // its measurement, not its estimate). Within 10% of the best there: ahead of every unmeasured
  // config (score: half the best estimate of any config), and among themselves in the order
  // they measured. Clearly slower: behind their own estimate (x1.5).
  double best_exact = 0.0, best_est = 0.0, best_unmeasured = 0.0, scale = 1.0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (exact[i] > 0.0 && (best_exact == 0.0 || exact[i] < best_exact)) {
      best_exact = exact[i];
      scale = exact[i] / out[i].est_us;
    }
    if (i == 0 || out[i].est_us < best_est) best_est = out[i].est_us;
    if (exact[i] == 0.0 && (best_unmeasured == 0.0 || out[i].est_us < best_unmeasured)) {
      best_unmeasured = out[i].est_us;
    }
  }
  const double best_there = best_unmeasured > 0.0 ? std::min(best_exact, best_unmeasured * scale) : best_exact;
  for (size_t i = 0; i < out.size(); ++i) {
    if (exact[i] == 0.0) continue;
    const bool well = exact[i] <= kWellMeasured * best_there;
    out[i].score = well ? kExactBoost * best_est * exact[i] / best_there : kExactSlow * out[i].est_us;
    out[i].reasons.push_back("registry: " + fmt(exact[i], 6) + " us measured on the same problem, " +
                             (well ? "within 10% of the best there (ranked as measured)"
                                   : "slower than the best there (x" + fmt(kExactSlow) + ")"));
  }
  std::stable_sort(out.begin(), out.end(), [](const Ranked& a, const Ranked& b) { return a.score < b.score; });
  return out;
}

// `--configs`: the ranked configs named in `names`, in score order. Names outside this pattern's
// space (another dtype's math, a stream-K variant its size does not list) and names the filter
// dropped are left out; when that leaves nothing, the pattern is not supported with these configs.
static std::vector<Ranked> named_configs(const std::vector<Ranked>& ranked, const std::vector<Dropped>& dropped,
                                         const std::vector<std::string>& names) {
  const std::set<std::string> wanted(names.begin(), names.end());
  std::vector<Ranked> out;
  for (const auto& r : ranked) {
    if (wanted.count(r.config.name())) out.push_back(r);
  }
  if (out.empty()) {
    std::vector<std::pair<std::string, std::string>> reasons;
    for (const auto& d : dropped) reasons.emplace_back(d.config.name(), d.reason);
    refuse_named(wanted, reasons);
  }
  return out;
}

Candidates candidates(const discover::Match& m, const CandidateOptions& opt) {
  if (!supports_candidates(m, opt.arch)) {
    throw UserError(std::string("kernel candidates: ") + discover::family_name(m.family) + " on " + opt.arch +
                    " is not supported (GEMM families on sm90 only)");
  }
  Candidates out;
  out.arch = opt.arch;
  out.signature = registry::signature(m);
  out.problem = GemmProblem::from_match(m);
  std::vector<registry::Hit> hits;
  if (opt.registry) hits = opt.registry->lookup(out.signature, opt.arch, m.problem, 64);
  auto configs = enumerate_sm90(out.problem, opt.precision);
  std::set<std::string> listed;
  for (const auto& c : configs) listed.insert(c.name());
  // The registry's signature does not say which math a kernel used: a tf32 config measured for
  // a model run under "high" must not come back for one that asks for "highest".
  // Nor may its time set "the best there" for the configs of this math (rank_sm90).
  const std::string math = configs.empty() ? std::string() : configs.front().math;
  std::vector<registry::Hit> usable;
  for (const auto& h : hits) {
    try {
      const auto c = GemmConfig::from_json(h.row.config);
      if (!math.empty() && c.math != math) continue;
      if (listed.insert(c.name()).second) configs.push_back(c);
      usable.push_back(h);
    } catch (const nlohmann::json::exception&) {
      // A row whose config is not a GemmConfig (another kernel kind): nothing to add.
    }
  }
  hits = std::move(usable);
  out.enumerated = configs.size();
  auto filtered = filter_sm90(out.problem, configs);
  out.dropped = std::move(filtered.dropped);
  out.kept = filtered.kept.size();
  auto ranked = rank_sm90(out.problem, filtered.kept, hits);
  if (!opt.only.empty()) {
    out.ranked = named_configs(ranked, out.dropped, opt.only);
    return out;
  }
  // The top N covers distinct kernels first. Configs that differ only in cluster shape score
  // within a few percent of each other in the model, so a plain cut would spend the tuner's whole
  // budget on one tile shape; so do a persistent config and its stream_k twin where the waves
  // leave little to share out. Pass 1 takes the best config of each (tile, schedule, stages) in
  // score order; pass 2 fills what is left with the runners-up; the result is then ordered by
  // score again.
  if (ranked.size() > opt.top_n) {
    auto key = [](const GemmConfig& c) {
      return tile_str(c) + "/" + c.kernel_schedule + "/" + std::to_string(c.stages);
    };
    std::set<std::string> seen;
    std::vector<bool> taken(ranked.size(), false);
    std::vector<Ranked> chosen;
    for (size_t i = 0; i < ranked.size() && chosen.size() < opt.top_n; ++i) {
      if (seen.insert(key(ranked[i].config)).second) {
        taken[i] = true;
        chosen.push_back(ranked[i]);
      }
    }
    for (size_t i = 0; i < ranked.size() && chosen.size() < opt.top_n; ++i) {
      if (!taken[i]) chosen.push_back(ranked[i]);
    }
    std::stable_sort(chosen.begin(), chosen.end(), [](const Ranked& a, const Ranked& b) { return a.score < b.score; });
    ranked = std::move(chosen);
  }
  out.ranked = std::move(ranked);
  return out;
}

std::string why_none_kept(const std::vector<Dropped>& dropped) {
  if (dropped.empty()) return "no config to build";
  std::map<std::string, size_t> count;
  for (const auto& d : dropped) {
    std::set<std::string> parts;
    for (size_t at = 0; at <= d.reason.size();) {
      const auto end = std::min(d.reason.find("; ", at), d.reason.size());
      parts.insert(d.reason.substr(at, end - at));
      at = end + 2;
    }
    for (const auto& part : parts) ++count[part];
  }
  std::vector<std::string> shared;
  std::pair<std::string, size_t> most{"", 0};
  for (const auto& [reason, n] : count) {
    if (n == dropped.size()) shared.push_back(reason);
    if (n > most.second) most = {reason, n};
  }
  const std::string head = "every one of the " + std::to_string(dropped.size()) + " configs was dropped";
  if (!shared.empty()) return head + ": " + join(shared, "; ");
  return head + "; most often (" + std::to_string(most.second) + " of them): " + most.first;
}

json dropped_json(const Candidates& c) {
  json dropped = json::array();
  for (const auto& d : c.dropped) {
    dropped.push_back({{"name", d.config.name()}, {"reason", d.reason}, {"config", d.config.to_json()}});
  }
  return {{"signature", c.signature}, {"arch", c.arch},        {"problem", c.problem.to_json()},
          {"enumerated", c.enumerated}, {"kept", c.kept},     {"dropped", dropped}};
}

json candidates_json(const Candidates& c) {
  json j = dropped_json(c);
  json ranked = json::array();
  for (size_t i = 0; i < c.ranked.size(); ++i) {
    const auto& r = c.ranked[i];
    ranked.push_back({{"rank", i + 1},
                      {"name", r.config.name()},
                      {"config", r.config.to_json()},
                      {"est_us", r.est_us},
                      {"score", r.score},
                      {"reasons", r.reasons}});
  }
  j["ranked"] = ranked;
  return j;
}

}  // namespace fact::realize
