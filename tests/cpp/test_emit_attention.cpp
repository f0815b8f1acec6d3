// Emission of fused attention kernels (CUTLASS's Hopper FMHA for bf16 / f16 and f32 in TF32, its
// sm80 kernel for f32): golden files, the config space and its filter, ranking (prior and
// registry), the math the precision allows, and the patterns FACT refuses with a reason.
//
// Update the golden files after an intended change with FACT_UPDATE_GOLDEN=1 ctest -R EmitAttention.
#include <gtest/gtest.h>

#include <algorithm>

#include "golden.h"
#include "ir/error.h"
#include "families/attention/attention.h"
#include "registry/registry.h"
#include "scratch_dir.h"

namespace fact::realize {
namespace {

using nlohmann::json;
using test::expect_golden;

// A plan attention pattern (docs/plan-format.md) with the fields emission reads.
json attention_pattern(const std::string& dtype, bool causal, int64_t d, int64_t heads = 8, int64_t kv_heads = 8,
                       int64_t seq = 512) {
  json steps = {"scale"};
  if (causal) steps.push_back("causal_mask");
  steps.push_back("softmax");
  return {{"family", "attention"},
          {"rule", "attention_handwritten"},
          {"signature", std::string("attention[scale") + (causal ? "+causal_mask" : "") + "+softmax]:" + dtype +
                            (causal ? ":causal" : "")},
          {"epilogue", steps},
          {"problem",
           {{"batch", 4}, {"heads", heads}, {"kv_heads", kv_heads}, {"seq_q", seq}, {"seq_k", seq},
            {"head_dim", d}, {"head_dim_v", d}}},
          {"attrs", {{"causal", causal}, {"scale", 0.125}, {"dtype", dtype}, {"out_dtype", dtype}}}};
}

// A passed, tuned registry row of `pattern`'s signature and problem for config `name`.
registry::Row measured(const json& pattern, const std::string& name, double time_us) {
  registry::Row row;
  row.signature = pattern["signature"];
  row.arch = "sm90";
  row.problem = pattern["problem"];
  row.config = {{"name", name}};
  row.time_us = time_us;
  row.provenance = "tuned";
  return row;
}

std::vector<std::string> names(const AttentionCandidates& c) {
  std::vector<std::string> out;
  for (const auto& r : c.ranked) out.push_back(r.config.name());
  return out;
}

TEST(EmitAttention, CausalBf16HeadDim96) {
  const auto spec = AttentionSpec::from_pattern(attention_pattern("bf16", true, 96));
  EXPECT_EQ(spec.kernel_head_dim, 96);  // native, not padded to 128
  const auto cands = attention_candidates(spec, "sig", json::object(), "sm90", 0, nullptr);
  ASSERT_GE(cands.ranked.size(), 4u);
  // Causal: the persistent ping-pong kernel first, its tiles heaviest first, its warp groups'
  // GEMMs overlapped and its next tile's Q loaded during this one.
  EXPECT_EQ(cands.ranked[0].config.name(), "q128kv128_pp_s5_q4_ov");
  EXPECT_EQ(cands.ranked[0].why, "prior");
  const auto pp = emit_attention_sm90(spec, cands.ranked[0].config);
  EXPECT_NE(pp.source.find("std::conditional_t<kCausal, CausalHeaviestFirstScheduler"), std::string::npos);
  EXPECT_NE(pp.source.find("constexpr bool kPersistent = true;"), std::string::npos);
  EXPECT_NE(pp.source.find("constexpr bool kOverlap = true;"), std::string::npos);
  EXPECT_NE(pp.source.find("Tag::kStagesQ, Int<4>>"), std::string::npos);
  expect_golden(pp, "attention_bf16_causal_d96_pp_q4_ov.cu");
  // The cooperative kernel runs one tile a CTA: no overlapped mainloop or second Q there.
  for (const auto& r : cands.ranked) {
    if (r.config.schedule == "cooperative") EXPECT_TRUE(!r.config.overlap && r.config.stages_q == 2) << r.config.name();
  }
  const auto coop = std::find_if(cands.ranked.begin(), cands.ranked.end(),
                                 [](const auto& r) { return r.config.name() == "q128kv128_coop_s5"; });
  ASSERT_NE(coop, cands.ranked.end());
  const auto k = emit_attention_sm90(spec, coop->config);
  EXPECT_EQ(k.name.rfind("fact_attention_bf16_causal_d96_", 0), 0u) << k.name;
  EXPECT_NE(k.source.find("cutlass::fmha::collective::CausalFusion"), std::string::npos);
  EXPECT_NE(k.source.find("constexpr bool kPersistent = false;"), std::string::npos);  // one CTA a tile
  EXPECT_EQ(k.source.find("v_keys_contiguous\":"), std::string::npos);  // bf16 reads V's head dim contiguous
  EXPECT_NE(k.source.find("contiguous is read in place by TF32 kernels only"), std::string::npos);  // refused
  expect_golden(k, "attention_bf16_causal_d96_coop.cu");
}

TEST(EmitAttention, NonCausalF16PingPongMasksTheLastKeyTile) {
  const auto spec = AttentionSpec::from_pattern(attention_pattern("f16", false, 128, 32, 8, 2048));
  const auto cands = attention_candidates(spec, "sig", json::object(), "sm90", 0, nullptr);
  // long sequence: ping-pong first (128 keys x 5 stages leave no room for a second Q at head dim 128)
  EXPECT_EQ(cands.ranked[0].config.name(), "q128kv128_pp_s5_ov");
  const auto k = emit_attention_sm90(spec, cands.ranked[0].config);
  EXPECT_NE(k.source.find("cutlass::fmha::collective::ResidualFusion"), std::string::npos);
  EXPECT_NE(k.source.find("constexpr bool kPersistent = true;"), std::string::npos);  // the ping-pong kernel
  expect_golden(k, "attention_f16_d128_pingpong.cu");
  // One kernel per (dtype, mask, head dim): batch, heads, sequence and scale are run-time.
  EXPECT_EQ(spec.id(), AttentionSpec::from_pattern(attention_pattern("f16", false, 128, 8, 8, 300)).id());
  EXPECT_NE(spec.id(), AttentionSpec::from_pattern(attention_pattern("f16", true, 128)).id());
}

TEST(EmitAttention, F32RunsInTheMathThePrecisionAllows) {
  const auto spec = AttentionSpec::from_pattern(attention_pattern("f32", true, 96));
  EXPECT_TRUE(spec.f32());
  EXPECT_EQ(spec.kernel_head_dim, 96);  // the sm80 kernel's kMaxK: native, the P @ V tile is that wide
  const auto high = attention_candidates(spec, "sig", json::object(), "sm90", 0, nullptr, "high");
  // TF32: Hopper's FMHA and the sm80 kernel, their prior orders alternating (Hopper's first:
  // cooperative for a short sequence, the deepest pipeline first; PyTorch's sm80 tile for head
  // dims above 64). 16 sm80 warps and TF32 tiles beyond shared memory are dropped.
  const auto ranked = names(high);
  ASSERT_EQ(ranked.size(), 22u);
  EXPECT_EQ(std::vector<std::string>(ranked.begin(), ranked.begin() + 4),
            (std::vector<std::string>{"q128kv64_coop_s5_tf32", "q32kv128_ms_tf32", "q128kv64_coop_s4_tf32",
                                      "q64kv128_ms_tf32"}));
  EXPECT_EQ(ranked.back(), "q128kv128_pp_s3_tf32");
  std::vector<std::string> dropped;
  for (const auto& d : high.dropped) dropped.push_back(d["config"]["name"].get<std::string>() + ": " +
                                                      d["reason"].get<std::string>());
  EXPECT_EQ(dropped, (std::vector<std::string>{
                         "q128kv128_ms_tf32: registers: 16 warps of 32 x 32 scores > 8 (at most 128 registers a thread)",
                         "q128kv128_coop_s5_tf32: shared memory: 288 KiB > 211 KiB",
                         "q128kv128_coop_s4_tf32: shared memory: 240 KiB > 211 KiB",
                         // the persistent kernel's second epilogue buffer: 64 x 64 fp32 outputs
                         "q128kv128_pp_s5_ov_tf32: shared memory: 305 KiB > 211 KiB",
                         // and a second tile's Q: 2 x 64 x 96 fp32
                         "q128kv128_pp_s5_q4_ov_tf32: shared memory: 353 KiB > 211 KiB",
                         "q128kv128_pp_s5_tf32: shared memory: 305 KiB > 211 KiB",
                         "q128kv128_pp_s5_q4_tf32: shared memory: 353 KiB > 211 KiB",
                         "q128kv128_pp_s4_ov_tf32: shared memory: 257 KiB > 211 KiB",
                         "q128kv128_pp_s4_q4_ov_tf32: shared memory: 305 KiB > 211 KiB",
                         "q128kv128_pp_s4_tf32: shared memory: 257 KiB > 211 KiB",
                         "q128kv128_pp_s4_q4_tf32: shared memory: 305 KiB > 211 KiB",
                         "q128kv128_pp_s3_q4_ov_tf32: shared memory: 257 KiB > 211 KiB",
                         "q128kv128_pp_s3_q4_tf32: shared memory: 257 KiB > 211 KiB",
                         "q128kv64_pp_s5_q4_ov_tf32: shared memory: 233 KiB > 211 KiB",
                         "q128kv64_pp_s5_q4_tf32: shared memory: 233 KiB > 211 KiB"}))
      << high.dropped.dump(1);
  EXPECT_EQ(names(attention_candidates(spec, "sig", json::object(), "sm90", 2, nullptr, "medium")),
            (std::vector<std::string>{"q128kv64_coop_s5_tf32", "q32kv128_ms_tf32"}));
  // highest: fp32-accurate 3xTF32 only; a TF32 measurement in the registry never comes back
  const auto highest = attention_candidates(spec, "sig", json::object(), "sm90", 0, nullptr, "highest");
  for (const auto& r : highest.ranked) EXPECT_EQ(r.config.math, "3xtf32") << r.config.name();
  EXPECT_THROW(attention_candidates(spec, "sig", json::object(), "sm90", 0, nullptr, "low"), NotSupported);
  {  // Registry rows of one kernel do not crowd the other out of a --candidates bound.
    const test::ScratchDir dir("fact_attnmix");
    const auto pattern = attention_pattern("f32", true, 96);
    {
      auto w = registry::Registry::open_writable(dir.file("r.db"));
      w.insert(measured(pattern, "q32kv128_ms_tf32", 850));
      w.insert(measured(pattern, "q64kv64_ms_tf32", 960));
    }
    const auto reg = registry::Registry::open_readonly(dir.file("r.db"));
    EXPECT_EQ(names(attention_candidates(spec, pattern["signature"], pattern["problem"], "sm90", 2, &*reg, "high")),
              (std::vector<std::string>{"q32kv128_ms_tf32", "q128kv64_coop_s5_tf32"}));
    EXPECT_EQ(names(attention_candidates(spec, pattern["signature"], pattern["problem"], "sm90", 3, &*reg, "high")),
              (std::vector<std::string>{"q32kv128_ms_tf32", "q64kv64_ms_tf32", "q128kv64_coop_s5_tf32"}));
  }
  {  // the registry's fastest TF32 row ranks first under high, and never comes back under highest
    const test::ScratchDir dir("fact_attn32");
    const auto pattern = attention_pattern("f32", true, 96);
    registry::Registry::open_writable(dir.file("r.db")).insert(measured(pattern, "q64kv64_ms_tf32", 100));
    const auto reg = registry::Registry::open_readonly(dir.file("r.db"));
    const auto tuned = attention_candidates(spec, pattern["signature"], pattern["problem"], "sm90", 0, &*reg, "high");
    EXPECT_EQ(tuned.ranked[0].config.name(), "q64kv64_ms_tf32");
    EXPECT_NE(tuned.ranked[0].why.find("registry"), std::string::npos);
    for (const auto& r : attention_candidates(spec, pattern["signature"], pattern["problem"], "sm90", 0, &*reg,
                                              "highest")
                             .ranked) {
      EXPECT_EQ(r.config.math, "3xtf32") << r.config.name();
      EXPECT_EQ(r.why, "prior");
    }
  }

  // Hopper in TF32: the MMAs read TF32, memory holds fp32, V is transposed for P @ V unless the
  // caller's V has its keys contiguous (the kernel says it reads that in place).
  const auto hopper = emit_attention(spec, high.ranked[0].config);
  EXPECT_EQ(hopper.name.rfind("fact_attention_f32_causal_d96_", 0), 0u) << hopper.name;
  EXPECT_NE(hopper.source.find("using ElementMma = cutlass::tfloat32_t;"), std::string::npos);
  EXPECT_NE(hopper.source.find("constexpr bool kTransposeV = true;"), std::string::npos);
  EXPECT_NE(hopper.source.find("\"math\":\"tf32\""), std::string::npos);
  EXPECT_NE(hopper.source.find("\"v_keys_contiguous\":true"), std::string::npos);
  EXPECT_NE(hopper.source.find("if (transposes_v(a)) {"), std::string::npos);
  expect_golden(hopper, "attention_f32_causal_d96_tf32_coop.cu");
  const auto k = emit_attention(spec, high.ranked[1].config);
  EXPECT_EQ(k.name.rfind("fact_attention_f32_causal_d96_", 0), 0u) << k.name;
  EXPECT_NE(k.source.find("using Operator = cutlass::arch::OpMultiplyAdd;"), std::string::npos);
  EXPECT_NE(k.source.find("\"out_layouts\":[\"bs(hd)\"]"), std::string::npos);
  expect_golden(k, "attention_f32_causal_d96_tf32.cu");
  const auto exact = emit_attention(spec, highest.ranked[0].config);
  EXPECT_NE(exact.source.find("using Operator = cutlass::arch::OpMultiplyAddFastF32;"), std::string::npos);
  EXPECT_NE(exact.name, k.name);
  // Head dims round up to the warp tile (40 -> 64), and PyTorch's 64 x 64 tile leads there.
  const auto small = AttentionSpec::from_pattern(attention_pattern("f32", false, 40));
  EXPECT_EQ(small.kernel_head_dim, 64);
  EXPECT_EQ(names(attention_candidates(small, "sig", json::object(), "sm90", 2, nullptr, "high"))[1],
            "q64kv64_ms_tf32");
  // Hopper takes f32 in TF32 only, the sm80 kernel no bf16.
  for (const char* math : {"", "3xtf32"}) {
    AttentionConfig c = high.ranked[0].config;
    c.math = math;
    EXPECT_THROW(emit_attention_sm90(spec, c), InternalError) << math;
  }
  const auto bf16 = AttentionSpec::from_pattern(attention_pattern("bf16", true, 96));
  EXPECT_THROW(emit_attention_sm80(bf16, high.ranked[1].config), InternalError);
  EXPECT_THROW(emit_attention_sm90(bf16, high.ranked[0].config), InternalError);  // a TF32 config
}

TEST(EmitAttention, ConfigsThatDoNotFitSharedMemoryAreDroppedWithAReason) {
  const auto spec = AttentionSpec::from_pattern(attention_pattern("bf16", true, 256));
  const auto cands = attention_candidates(spec, "sig", json::object(), "sm90", 0, nullptr);
  ASSERT_FALSE(cands.dropped.empty());
  for (const auto& d : cands.dropped) {
    EXPECT_NE(d["reason"].get<std::string>().find("shared memory"), std::string::npos) << d.dump();
    AttentionConfig c;
    c.block_kv = d["config"]["block_kv"];
    c.schedule = d["config"]["schedule"];
    c.stages_kv = d["config"]["stages_kv"];
    c.stages_q = d["config"].value("stages_q", 2);
    EXPECT_GT(attention_smem_bytes(spec, c), 211 * 1024) << d.dump();
  }
  for (const auto& r : cands.ranked) EXPECT_LE(attention_smem_bytes(spec, r.config), 211 * 1024) << r.config.name();
  EXPECT_FALSE(cands.ranked.empty());  // 64-key tiles with fewer stages still fit
  // Head dim 64 fits everything.
  const auto small = AttentionSpec::from_pattern(attention_pattern("bf16", true, 64));
  EXPECT_TRUE(attention_candidates(small, "sig", json::object(), "sm90", 0, nullptr).dropped.empty());
}

TEST(EmitAttention, RegistryMeasurementsRankFirst) {
  const test::ScratchDir dir("fact_attn");
  const auto pattern = attention_pattern("bf16", true, 96);
  const auto spec = AttentionSpec::from_pattern(pattern);
  {
    auto reg = registry::Registry::open_writable(dir.file("r.db"));
    registry::Row row = measured(pattern, "q128kv64_pp_s4", 250);
    reg.insert(row);
    row.config = {{"name", "q128kv64_coop_s3"}};
    row.disposition = "incorrect";  // never ranked from a failed row
    reg.insert(row);
    row.disposition = "passed";  // a far problem (Llama's sizes) does not rank configs here
    row.config = {{"name", "q128kv64_pp_s3"}};
    row.problem["batch"] = 4;
    row.problem["seq_q"] = row.problem["seq_k"] = 2048;
    row.time_us = 10;
    reg.insert(row);
    row.config = {{"name", "q128kv64_coop_s5"}};  // a close one does, after the exact one
    row.problem["batch"] = 8;
    row.problem["seq_q"] = row.problem["seq_k"] = 512;
    row.time_us = 300;
    reg.insert(row);
  }
  const auto reg = registry::Registry::open_readonly(dir.file("r.db"));
  const auto cands = attention_candidates(spec, pattern["signature"], pattern["problem"], "sm90", 3, &*reg);
  ASSERT_EQ(cands.ranked.size(), 3u);
  EXPECT_EQ(cands.ranked[0].config.name(), "q128kv64_pp_s4");
  EXPECT_NE(cands.ranked[0].why.find("registry: 250.0 us"), std::string::npos) << cands.ranked[0].why;
  EXPECT_EQ(names(cands)[1], "q128kv64_coop_s5");  // batch 8 vs 4: nearest
  EXPECT_NE(cands.ranked[1].why.find("nearest"), std::string::npos) << cands.ranked[1].why;
  EXPECT_EQ(names(cands)[2], "q128kv128_pp_s5_q4_ov");  // then the prior; the far row is ignored
}

TEST(EmitAttention, RefusesWhatTheKernelCannotCompute) {
  auto expect_refused = [](json p, const std::string& why) {
    try {
      AttentionSpec::from_pattern(p);
      ADD_FAILURE() << "accepted: " << p.dump();
    } catch (const NotSupported& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  expect_refused(attention_pattern("f8", true, 64), "bf16, f16 and f32 only");
  // f32 patterns the sm80 kernel cannot compute: Hopper's FMHA in TF32 only (its configs alone
  // are ranked, the sm80 ones dropped with the reason); refused under highest (sm80 only).
  auto f32_bhsd = attention_pattern("f32", true, 64);
  f32_bhsd["attrs"]["out_layout"] = "bhsd";
  // Grouped-query attention is for it (one launch per K/V head): sm80 configs under highest.
  const auto gqa = AttentionSpec::from_pattern(attention_pattern("f32", true, 64, 8, 2));
  EXPECT_EQ(gqa.sm80_refusal, "");
  const auto accurate = attention_candidates(gqa, "sig", json::object(), "sm90", 0, nullptr, "highest");
  ASSERT_FALSE(accurate.ranked.empty());
  for (const auto& r : accurate.ranked) EXPECT_EQ(r.config.name().substr(r.config.name().size() - 9), "ms_3xtf32");
  const std::pair<json, std::string> sm80_cannot[] = {
      {attention_pattern("f32", true, 256), "head dim 256 (the sm80 kernel: at most 128)"},
      {f32_bhsd, "output layout bhsd"}};
  for (const auto& [pattern, why] : sm80_cannot) {
    const auto spec = AttentionSpec::from_pattern(pattern);
    EXPECT_NE(spec.sm80_refusal.find(why), std::string::npos) << spec.sm80_refusal;
    try {
      attention_candidates(spec, "sig", json::object(), "sm90", 0, nullptr, "highest");
      ADD_FAILURE() << "accepted under highest: " << pattern.dump();
    } catch (const NotSupported& e) {
      EXPECT_NE(std::string(e.what()).find("'highest' runs the sm80 kernel"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
    if (spec.head_dim > 128) {  // TF32 tiles of head dim 256 exceed shared memory too
      try {
        attention_candidates(spec, "sig", json::object(), "sm90", 0, nullptr, "high");
        ADD_FAILURE() << "a config fits: " << pattern.dump();
      } catch (const NotSupported& e) {
        EXPECT_NE(std::string(e.what()).find("no attention kernel config fits"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("shared memory"), std::string::npos) << e.what();
      }
      continue;
    }
    const auto high = attention_candidates(spec, "sig", json::object(), "sm90", 0, nullptr, "high");
    ASSERT_FALSE(high.ranked.empty());
    for (const auto& r : high.ranked) EXPECT_FALSE(r.config.sm80()) << r.config.name();
    size_t sm80_dropped = 0;
    for (const auto& d : high.dropped) sm80_dropped += d["reason"].get<std::string>() == spec.sm80_refusal;
    EXPECT_EQ(sm80_dropped, 6u);
  }
  EXPECT_TRUE(AttentionSpec::from_pattern(attention_pattern("f32", true, 64, 8, 1)).sm80_refusal.empty());  // MQA
  {  // head dim 160 in TF32: the persistent kernel's second fp32 epilogue buffer (17 KiB) does not
     // fit next to 200 KiB of tiles (it came to 235 KiB when compiled), the cooperative one does
    const auto d160 = AttentionSpec::from_pattern(attention_pattern("f32", true, 160, 8, 2, 2048));
    const auto c = attention_candidates(d160, "sig", json::object(), "sm90", 0, nullptr, "high");
    EXPECT_EQ(names(c), (std::vector<std::string>{"q128kv64_coop_s3_tf32"}));
    bool pp_dropped = false;
    for (const auto& d : c.dropped) {
      pp_dropped |= d["config"]["name"] == "q128kv64_pp_s3_tf32" &&
                    d["reason"] == "shared memory: 217 KiB > 211 KiB";
    }
    EXPECT_TRUE(pp_dropped) << c.dropped.dump(1);
  }
  auto p = attention_pattern("bf16", true, 64);
  p["attrs"]["out_layout"] = "bhsd";  // Hopper's kernel writes any layout
  EXPECT_NO_THROW(AttentionSpec::from_pattern(p));
  p = attention_pattern("bf16", true, 64);
  p["problem"]["head_dim_v"] = 128;
  expect_refused(p, "value head dim 128");
  expect_refused(attention_pattern("bf16", true, 64, 6, 4), "not a multiple of kv_heads");
  expect_refused(attention_pattern("bf16", true, 60), "head dim 60");
  p = attention_pattern("bf16", true, 64);
  p["problem"]["seq_q"] = 1024;
  expect_refused(p, "more queries (1024) than keys (512)");
  p = attention_pattern("bf16", false, 64);
  p["epilogue"].push_back("relu");
  expect_refused(p, "step 'relu'");
  p = attention_pattern("bf16", false, 64);
  p["attrs"]["out_dtype"] = "f32";
  expect_refused(p, "output in f32");
  p = attention_pattern("bf16", false, 64);
  p["attrs"].erase("scale");
  expect_refused(p, "scale");
  EXPECT_THROW(attention_candidates(AttentionSpec::from_pattern(attention_pattern("bf16", true, 64)), "sig",
                                    json::object(), "sm80", 4, nullptr),
               NotSupported);
}

TEST(EmitAttention, ConfigsByNameKeepRankOrderAndSayWhyNoneFits) {
  const auto spec = AttentionSpec::from_pattern(attention_pattern("bf16", true, 128));
  for (const auto& r : attention_candidates(spec, "sig", json::object(), "sm90", 0, nullptr).ranked) {
    EXPECT_TRUE(AttentionConfig::is_name(r.config.name())) << r.config.name();  // so --configs can name it
  }
  EXPECT_TRUE(AttentionConfig::is_name("q32kv128_ms_3xtf32"));
  EXPECT_FALSE(AttentionConfig::is_name("t128x128x64_c1x1_coop_tmacoop_sauto_persistent"));
  EXPECT_FALSE(AttentionConfig::is_name("q128kv128_pp"));
  const auto cands = attention_candidates(spec, "sig", json::object(), "sm90", 1, nullptr, "highest",
                                          {"q128kv128_pp_s3", "q128kv128_pp_s5_ov", "q128kv128_pp_s5_q4_ov"});
  EXPECT_EQ(names(cands), (std::vector<std::string>{"q128kv128_pp_s5_ov", "q128kv128_pp_s3"}));  // rank order
  try {
    attention_candidates(spec, "sig", json::object(), "sm90", 0, nullptr, "highest",
                         {"q128kv128_pp_s5_q4_ov", "q128kv128_coop_s5_q4"});
    FAIL() << "expected NotSupported";
  } catch (const NotSupported& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("q128kv128_pp_s5_q4_ov: shared memory: 233 KiB > 211 KiB"), std::string::npos) << what;
    EXPECT_NE(what.find("q128kv128_coop_s5_q4: not in this pattern's configuration space"), std::string::npos)
        << what;
  }
}

}  // namespace
}  // namespace fact::realize
