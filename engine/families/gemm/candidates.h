// Stage 2's first step for a GEMM-family match: which kernel configs to compile and time.
//
//   1. enumerate  literal per-arch lists of GemmConfigs (the way CUTLASS's generator lists its
//                 instances), not the full cross product of the plan's search space (entry.cpp);
//   2. filter     drop the configs that cannot build or cannot run on this problem, each with a
//                 human reason (shared memory, registers, schedule rules, TMA alignment);
//   3. rank       a wave-quantization estimate of each survivor's time, adjusted by what the
//                 registry has measured for similar problems; keep the best N.
//
// Only sm90 (CUTLASS 3.x, TMA + WGMMA, warp-specialized kernels) is implemented. The model is
// deliberately simple: it orders configs so that the few compiled first are plausible; the tuner's
// measurements, not this model, pick the winner (and go back into the registry to steer later
// rankings).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "discover/pattern.h"
#include "families/gemm/config.h"
#include "registry/registry.h"

namespace fact::realize {

// H100 SXM / H200: 132 SMs, 227 KB of shared memory a CTA may opt into (228 KB per SM, 1 KB
// reserved by the system). 232 registers per thread is what CUTLASS's warp-specialized kernels
// give their MMA warpgroups (setmaxnreg; the producer warpgroup drops to 40).
inline constexpr int kSm90SmCount = 132;
// Parts of a horizontal GEMM one grouped kernel takes (FACT_MAX_GEMM_PARTS of fact_gemm_abi.h).
inline constexpr size_t kMaxGemmParts = 8;
inline constexpr int64_t kSm90SmemPerCta = 227 * 1024;
inline constexpr int kSm90ConsumerRegisters = 232;

// SMs a persistent grid of `cluster_size`-CTA clusters occupies at once on such a GPU: the
// clusters that fit (cudaOccupancyMaxActiveClusters) times their size. A cluster must sit in one
// GPC, and not every GPC holds a multiple of 4 SMs, so 4-CTA clusters leave 12 SMs idle. Measured on
// the lent H200 (bench/cluster_occupancy.cu: 132 SMs for clusters of 1 and 2, 120 for 4 and 8,
// 112 for 16); which GPCs lose SMs varies from chip to chip, so another H100/H200 may differ a
// little. The generated kernels ask the device itself at run time.
int sm90_cluster_sms(int cluster_size);

// What the filter and the model need to know about a GEMM-family match.
struct GemmProblem {
  std::string family;  // gemm | horizontal_gemm | gated_mlp
  int64_t batch = 1, m = 0, n = 0, k = 0;
  std::string dtype_a = "bf16", dtype_b = "bf16", dtype_out = "bf16";
  std::string layout_a = "row", layout_b = "col";  // row | col | strided
  int b_operands = 1;         // gated_mlp: 2 (gate and up tiles per stage, two accumulators)
  bool reads_source = false;  // the epilogue reads a full m x n tensor (residual): C smem buffers
  std::vector<int64_t> n_parts;  // horizontal_gemm: each part's n (each is its own output)

  // UserError when the match is not a GEMM family or lacks sizes/dtypes.
  static GemmProblem from_match(const discover::Match& m);
  nlohmann::json to_json() const;
};

// Shared-memory estimate of one config on one problem (bytes).
struct SmemEstimate {
  int64_t stage_bytes = 0;       // A tile + B tile(s) + the stage's two mbarriers
  int64_t epilogue_bytes = 0;    // D (and C) staging buffers + scheduler/barrier storage
  int stages = 0;                // the stage count it builds with: the config's, or auto's choice
  int64_t total_bytes = 0;       // stages * stage_bytes + epilogue_bytes
};
SmemEstimate smem_sm90(const GemmProblem& p, const GemmConfig& c);

struct Dropped {
  GemmConfig config;
  std::string reason;  // one line, says which limit and by how much
};

struct FilterResult {
  std::vector<GemmConfig> kept;
  std::vector<Dropped> dropped;
};

struct Ranked {
  GemmConfig config;
  double est_us = 0;  // the wave model's time, before registry adjustment
  // The ranking key, lower is better: est_us times a registry boost (measured on nearby problems,
  // or clearly slower on this one); for configs measured well on this very problem, their
  // measured order placed ahead of every unmeasured config (rank_sm90).
  double score = 0;
  std::vector<std::string> reasons;  // why it ranks where it does (waves, penalties, registry)
};

struct CandidateOptions {
  std::string arch = "sm90";
  size_t top_n = 8;  // `--candidates N`
  // `--configs NAME,...`: exactly these configs (GemmConfig::name()) instead of the ranked top N,
  // those that pass the filter for the problem. Empty: rank and cut as usual.
  std::vector<std::string> only;
  // float32 matmul precision for f32 operands: highest -> 3xtf32 math, high | medium -> tf32.
  std::string precision = "highest";
  const registry::Registry* registry = nullptr;  // consulted for boosts; may be null
};

struct Candidates {
  std::string signature;  // registry key of the match
  std::string arch;
  GemmProblem problem;
  size_t enumerated = 0;        // configs listed before filtering
  std::vector<Ranked> ranked;   // the best top_n survivors, best first
  std::vector<Dropped> dropped; // every config the filter removed, in enumeration order
  size_t kept = 0;              // survivors before the top_n cut
};

// True for gemm, horizontal_gemm and gated_mlp on sm90: the cases candidates() handles.
bool supports_candidates(const discover::Match& m, const std::string& arch);

// Step 1. The literal sm90 list for this problem: tiles x clusters x schedules, stages auto,
// persistent (plus stream_k where K is long or the tile count is under one wave). f32 operands
// get tile_k 32 and TF32 math under "high" and "medium"; under "highest" they get the sm80
// multistage kernels in 3xTF32 instead (enumerate_multistage).
std::vector<GemmConfig> enumerate_sm90(const GemmProblem& p, const std::string& precision = "highest");
// The fp32-accurate list: CUTLASS's 3xTF32 tiles and stages for sm80 kernels, which run on sm90.
std::vector<GemmConfig> enumerate_multistage();

// Step 2. Keeps or drops each config (any config, not only enumerated ones), in order.
FilterResult filter_sm90(const GemmProblem& p, const std::vector<GemmConfig>& configs);

// Step 3. Scores the configs (all of them, best first): the wave model of sm90 kernels or of sm80
// multistage kernels, then the registry. `hits`: registry rows for this
// signature and arch (Registry::lookup), used to boost configs measured fast on similar problems.
std::vector<Ranked> rank_sm90(const GemmProblem& p, const std::vector<GemmConfig>& configs,
                              const std::vector<registry::Hit>& hits = {});

// Steps 1-3 for one match. Registry configs measured on similar problems join the enumeration
// (so a tuned config with, say, fixed stages is considered even though the lists never produce
// it), then face the same filter. The top N takes the best config of each distinct kernel (tile,
// schedule, tile scheduler, stages) before any cluster-shape variant of one already taken, and is
// returned best score first. UserError for families or arches it does not handle.
// With opt.only: the named configs in this pattern's space that pass the filter, best score
// first; NotSupported when none does. Without: ranked is empty where the filter drops every
// config (say, TF32 with a B that is not K-major); why_none_kept says why.
Candidates candidates(const discover::Match& m, const CandidateOptions& opt = {});

// Why a pattern gets no kernel when the filter drops every config: the reasons all of them share
// (a dtype or layout the kernels cannot take), else the most frequent one.
std::string why_none_kept(const std::vector<Dropped>& dropped);

// The dropped configs as JSON, for the caller to write into the run directory:
//   {"signature", "arch", "problem", "enumerated", "kept", "dropped": [{"config", "name", "reason"}]}
nlohmann::json dropped_json(const Candidates& c);
// The whole result (ranked with rank, score, est_us, reasons; plus the dropped log).
nlohmann::json candidates_json(const Candidates& c);

}  // namespace fact::realize
