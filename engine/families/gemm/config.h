// A kernel configuration: the compile-time parameters of one CUTLASS kernel instance, plus the
// run-time knobs that the same binary takes per launch. Configs are plain data; the procedural
// name encodes every compile-time field and is the config's identity (and part of its cache key).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace fact::realize {

// Compile-time: one binary per distinct value of these.
struct GemmConfig {
  int tile_m = 128, tile_n = 128, tile_k = 64;
  int cluster_m = 1, cluster_n = 1;
  // cooperative | pingpong: sm90 warp-specialized (TMA + WGMMA); multistage: an sm80 kernel
  // (cp.async + mma.sync), the only tensor-core form of 3xTF32 in CUTLASS for these GPUs.
  std::string kernel_schedule = "cooperative";
  // tma_cooperative | tma (matches the sm90 kernel schedule); visitor: the sm80 visitor epilogue
  std::string epilogue_schedule = "tma_cooperative";
  int stages = 0;                                   // 0: as many as shared memory allows (sm90)
  std::string tile_scheduler = "persistent";        // persistent | stream_k | group (sm90); grid (sm80)
  std::string math = "default";                     // default | tf32 | 3xtf32 (f32 operands)

  std::string name() const;  // "t128x128x64_c2x1_coop_tmacoop_sauto_persistent"
  // Whether `text` has the shape of a name() (not whether a problem can use that config).
  static bool is_name(const std::string& text);
  nlohmann::json to_json() const;
  static GemmConfig from_json(const nlohmann::json& j);
  bool operator==(const GemmConfig&) const = default;
};

// Warps along M and N of a multistage (sm80) kernel's threadblock tile, as CUTLASS's generator
// lays them out for 3xTF32 (GenerateSM80_TensorOp_1688_fast_fp32_math): 8 warps, 4 along the
// longer side, for tiles of 16K elements or more; 2x2 below.
std::pair<int, int> multistage_warps(const GemmConfig& c);

// Run-time knobs of one launch of a compiled kernel (no recompilation to change them).
struct LaunchKnobs {
  std::string raster = "heuristic";  // heuristic | along_m | along_n
  int max_swizzle = 1;               // 1, 2, 4, 8
  int splits = 1;                    // split-K factor (stream_k scheduler), 1 = none
  // How a split tile's partial sums are added (stream_k scheduler): deterministic (in K order)
  // or nondeterministic (atomic adds, in arrival order; the last bits may differ between runs).
  std::string reduction = "deterministic";
  // How output tiles are shared out (stream_k scheduler): heuristic (CUTLASS's: stream-K only
  // for a last wave less than half full), stream_k (whenever the last wave is partial) or
  // data_parallel.
  std::string decomposition = "heuristic";

  // "r_heur_s1_k1"; "_nd" for a nondeterministic reduction, "_sk" / "_dp" for a stream-K /
  // data-parallel decomposition
  std::string name() const;
  nlohmann::json to_json() const;
};

}  // namespace fact::realize
