#include "realize/config_space.h"

namespace fact::realize {

using discover::Family;
using nlohmann::json;

namespace {

bool is_fp32(const discover::Match& m) {
  const auto& a = m.attrs;
  const std::string dtype = a.contains("dtype_a") ? a["dtype_a"].get<std::string>() : a.value("dtype", "");
  return dtype == "f32";
}

// CUTLASS 3.x SM90 GEMMs: TMA + WGMMA, warp-specialized kernel schedules.
json gemm_sm90(const discover::Match& m) {
  const auto& p = m.problem;
  const bool large_k = p.value("k", 0) >= 16 * std::max<int64_t>(p.value("m", 1), p.value("n", 1));
  json s = {
      {"tile_m", {64, 128, 256}},
      {"tile_n", {64, 128, 256}},
      {"tile_k", is_fp32(m) ? json{32} : json{64, 128}},
      {"cluster", {"1x1", "2x1", "1x2", "2x2"}},
      {"kernel_schedule", {"warpspecialized_cooperative", "warpspecialized_pingpong"}},
      {"epilogue_schedule", {"tma_warpspecialized_cooperative", "tma_warpspecialized"}},
      {"stages", {"auto", 3, 4, 5, 6}},
      {"raster", {"along_m", "along_n"}},
      {"swizzle", {1, 2, 4, 8}},
      // stream-K kernels' run-time knobs (LaunchKnobs): the decomposition, and split-K factors
      {"decomposition", {"heuristic", "stream_k", "data_parallel"}},
      {"splits", large_k ? json{1, 2, 4} : json{1}},
  };
  if (is_fp32(m)) s["math"] = {"tf32", "3xtf32"};  // by precision policy: high | highest
  return s;
}

// CUTLASS 2.x SM80 GEMMs: cp.async multistage, mma.sync.
json gemm_sm80(const discover::Match& m) {
  json s = {{"tile_m", {64, 128, 256}}, {"tile_n", {64, 128, 256}}, {"tile_k", {32, 64}},
            {"warps", {"2x2", "4x2", "2x4"}}, {"stages", {3, 4, 5}}, {"swizzle", {1, 2, 4, 8}},
            {"split_k", {1, 2, 4, 8, 16}}};
  if (is_fp32(m)) s["math"] = {"tf32", "3xtf32", "simt"};
  return s;
}

}  // namespace

json search_space(const discover::Match& m, const std::string& arch) {
  const bool hopper = arch == "sm90";
  switch (m.family) {
    case Family::gemm:
    case Family::horizontal_gemm:
    case Family::gated_mlp:
      return hopper ? gemm_sm90(m) : gemm_sm80(m);
    case Family::attention:
      if (hopper) {  // CUTLASS's Hopper FMHA (realize/attention.h): what FACT emits and tunes
        return {{"block_q", {128}},
                {"block_kv", {64, 128}},
                {"kernel_schedule", {"cooperative", "pingpong"}},
                {"stages_kv", {3, 4, 5}},
                {"mainloop_locked", {false, true}}};
      }
      return {{"tile_q", {64, 128}}, {"tile_kv", {64, 128}}, {"stages", {2, 3}}};
    case Family::norm:
      return {{"rows_per_block", {1, 2, 4, 8}}, {"vector_bytes", {8, 16}}, {"threads", {128, 256, 512}}};
    case Family::pointwise:  // realize/pointwise.h: 16-byte vectors of the last dim per thread
      return {{"block", {"128x4", "256x2", "256x4"}}};  // threads x vectors a thread
  }
  return json::object();
}

}  // namespace fact::realize
