// Emission for fused attention (forward): a plan pattern of family `attention` -> CUDA C++
// exporting the C ABI in abi/fact_attention_abi.h, from one of two CUTLASS kernels that ship as
// examples in the CUTLASS tree (included from there, never copied):
//   bf16 / f16: the Hopper FMHA collectives (examples/88_hopper_fmha: TMA, warp-specialized
//     WGMMA). Tunables: K/V tile, schedule (cooperative or ping-pong), K/V pipeline stages and
//     whether the two MMA warp groups take turns in the mainloop.
//   f32: where the float32 matmul precision allows TF32 (`high`, `medium`), the same Hopper
//     FMHA with TF32 WGMMAs (they read shared memory K-major only, so P @ V takes a transposed
//     copy of V, made by the kernel in its workspace) and the sm80 kernel below in TF32; under
//     `highest` the sm80 kernel only, in 3xTF32 (fp32-accurate).
//   The sm80 kernel: CUTLASS's memory-efficient attention (examples/41_fused_multi_head_attention,
//     the kernel PyTorch's SDPA runs for fp32), mma.sync TF32 instructions: one per product
//     (TF32) or three (3xTF32). Tunables: query and key tile.
//
// One kernel serves every problem of its dtype, mask and head dim: batch, heads, sequence
// lengths, the softmax scale, grouped-query attention (the sm80 kernel: one K/V head per query
// head, or one for all) and the tensors' strides are run-time arguments.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "realize/kernel.h"

namespace fact::registry {
class Registry;
}

namespace fact::realize {

struct AttentionSpec {
  std::string dtype;  // bf16 | f16 | f32 (Q, K, V and O)
  bool causal = false;
  int64_t head_dim = 0;         // the pattern's
  int64_t kernel_head_dim = 0;  // the kernel's tile: head_dim rounded up to 16 (bf16, f16), to 32 (f32)
  int64_t batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_k = 0;  // the plan's problem (ranking only)

  static AttentionSpec from_pattern(const nlohmann::json& pattern);  // NotSupported if it cannot be
  std::string id() const;  // short stable hash of what the kernel is specialised on
  // f32: the sm80 kernel is a candidate (under `highest` the only one), Hopper's runs in TF32
  bool f32() const { return dtype == "f32"; }
  // Why the sm80 kernel cannot compute the pattern (f32; empty when it can): a head dim above
  // 128, or an output other than a contiguous (batch, seq, heads, dim) one.
  // Hopper's FMHA in TF32 can; under `highest` the pattern is refused.
  std::string sm80_refusal;
};

struct AttentionConfig {
  int block_q = 128;   // query rows per CTA (Hopper: split over the MMA warp groups)
  int block_kv = 128;  // keys per mainloop step
  // cooperative | pingpong (Hopper; ping-pong is persistent, Q loaded separately) |
  // multistage (the sm80 kernel: cp.async pipelines, mma.sync)
  std::string schedule = "cooperative";
  int stages_kv = 5;   // Hopper only
  // Hopper: Q buffers of 64 rows, one per MMA warp group and tile; with two tiles' worth the
  // persistent kernel loads its next tile's Q while this one runs
  int stages_q = 2;
  int mma_warpgroups = 2;  // Hopper only
  bool mainloop_locked = false;  // Hopper: the MMA warp groups issue their GEMMs in turn
  // Hopper: each MMA warp group's softmax overlaps its own P @ V (FlashAttention-3's two stages)
  bool overlap = false;
  // f32 only: tf32 (one TF32 MMA per product; Hopper or sm80) | 3xtf32 (sm80, fp32-accurate)
  std::string math;
  bool sm80() const { return schedule == "multistage"; }  // the sm80 kernel's config, else Hopper's
  std::string name() const;
  nlohmann::json to_json() const;
  // Whether `text` has the form of a config name (for --configs).
  static bool is_name(const std::string& text);
};

// Shared memory the collective needs for a config (Q stages + K/V stages, and the persistent
// kernel's second epilogue buffer), in bytes.
int64_t attention_smem_bytes(const AttentionSpec& spec, const AttentionConfig& c);

struct RankedAttention {
  AttentionConfig config;
  std::string why;  // prior or registry measurement
};

struct AttentionCandidates {
  std::vector<RankedAttention> ranked;  // best first, at most top_n
  nlohmann::json dropped = nlohmann::json::array();  // {config, reason} per config filtered out
  nlohmann::json to_json() const;
};

// The config space for a spec, filtered (shared memory) and ranked: configs the registry has
// measured for this signature first (exact problem, then problems within a factor of 4 over all
// sizes; fastest first), then the prior order (Hopper: cooperative first for short sequences,
// ping-pong first for long ones; f32: PyTorch's own tile choice first). `precision` (the
// float32 matmul precision: highest | high | medium) picks an f32 kernel's math. `only`
// (--configs): exactly the ranked configs it names, in rank order, instead of the top N;
// NotSupported naming each and why (dropped with its reason, or not in the space) when none is
// left.
AttentionCandidates attention_candidates(const AttentionSpec& spec, const std::string& signature,
                                         const nlohmann::json& problem, const std::string& arch, size_t top_n,
                                         const registry::Registry* reg, const std::string& precision = "highest",
                                         const std::vector<std::string>& only = {});

// The kernel for a spec and config: Hopper's FMHA for 16-bit specs, the sm80 kernel for f32.
EmittedKernel emit_attention(const AttentionSpec& spec, const AttentionConfig& config);
EmittedKernel emit_attention_sm90(const AttentionSpec& spec, const AttentionConfig& config);
EmittedKernel emit_attention_sm80(const AttentionSpec& spec, const AttentionConfig& config);

// The attention ABI header generated kernels include (next to abi_header_text()'s).
const char* attention_abi_header_text();

}  // namespace fact::realize
