// Emission for fused attention (forward): a plan pattern of family `attention` -> CUDA C++ for
// sm_90a built on CUTLASS's Hopper FMHA collectives (examples/88_hopper_fmha in the CUTLASS
// tree, included from there), exporting the C ABI in abi/fact_attention_abi.h.
//
// One kernel serves every problem of its dtype, mask and head dim: batch, heads, sequence
// lengths, the softmax scale, grouped-query attention and the tensors' strides are run-time
// arguments. The tunables are CUTLASS's: K/V tile, schedule (cooperative or ping-pong),
// K/V pipeline stages and whether the two MMA warp groups take turns in the mainloop.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "realize/emit.h"

namespace fact::registry {
class Registry;
}

namespace fact::realize {

struct AttentionSpec {
  std::string dtype;  // bf16 | f16 (Q, K, V and O)
  bool causal = false;
  int64_t head_dim = 0;         // the pattern's
  int64_t kernel_head_dim = 0;  // the kernel's tile (head_dim rounded up to 16)
  int64_t batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_k = 0;  // the plan's problem (ranking only)

  static AttentionSpec from_pattern(const nlohmann::json& pattern);  // NotSupported if it cannot be
  std::string id() const;  // short stable hash of what the kernel is specialised on
};

struct AttentionConfig {
  int block_q = 128;   // query rows per CTA (split over the MMA warp groups)
  int block_kv = 128;  // keys per mainloop step
  std::string schedule = "cooperative";  // cooperative | pingpong (persistent, Q loaded separately)
  int stages_kv = 5;
  int mma_warpgroups = 2;
  bool mainloop_locked = false;  // the MMA warp groups issue their GEMMs in turn
  std::string name() const;
  nlohmann::json to_json() const;
};

// Shared memory the collective needs for a config (Q stages + K/V stages), in bytes.
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
// sizes; fastest first), then the prior order (cooperative first for short sequences, ping-pong
// first for long ones).
AttentionCandidates attention_candidates(const AttentionSpec& spec, const std::string& signature,
                                         const nlohmann::json& problem, const std::string& arch, size_t top_n,
                                         const registry::Registry* reg);

EmittedKernel emit_attention_sm90(const AttentionSpec& spec, const AttentionConfig& config);

// The attention ABI header generated kernels include (next to abi_header_text()'s).
const char* attention_abi_header_text();

}  // namespace fact::realize
