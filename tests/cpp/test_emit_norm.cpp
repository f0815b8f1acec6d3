// Emission of row-norm kernels (LayerNorm, RMSNorm): golden files, the block widths offered, and
// the rows FACT refuses with a reason.
//
// Update the golden files after an intended change with FACT_UPDATE_GOLDEN=1 ctest -R EmitNorm.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "golden.h"
#include "families/norm/norm.h"

namespace fact::realize {
namespace {

using nlohmann::json;

// A plan norm pattern (docs/plan-format.md) with the fields emission reads.
json norm_pattern(const std::string& rule, const std::string& kind, const std::string& dtype, int64_t cols,
                  bool weight, bool bias, const std::string& dtype_out = "", const std::string& round_to = "") {
  json ops = {{{"role", "x"}, {"node", "x"}, {"type", dtype + "[64, " + std::to_string(cols) + "]"}}};
  if (weight) ops.push_back({{"role", "weight"}, {"node", "w"}, {"type", dtype + "[" + std::to_string(cols) + "]"}});
  if (bias) ops.push_back({{"role", "bias"}, {"node", "b"}, {"type", dtype + "[" + std::to_string(cols) + "]"}});
  json attrs = {{"kind", kind}, {"eps", 1e-5}, {"dtype_in", dtype}, {"dtype_out", dtype_out.empty() ? dtype : dtype_out}};
  if (!round_to.empty()) attrs["round_to"] = round_to;
  return {{"family", "norm"},
          {"rule", rule},
          {"attrs", attrs},
          {"problem", {{"rows", 64}, {"cols", cols}}},
          {"operands", ops}};
}

using test::expect_golden;

TEST(EmitNorm, LayerNormBf16WithWeightAndBias) {
  const auto spec = NormSpec::from_pattern(norm_pattern("norm", "layer_norm", "bf16", 768, true, true));
  EXPECT_EQ(spec.vector_width(), 8);
  EXPECT_FALSE(spec.round_before_weight);
  const auto configs = norm_configs(spec);
  // 96 vectors a row: 96 threads x 1, 64 x 2 (48 rounded up to whole warps), 32 x 3
  ASSERT_EQ(configs.size(), 3u);
  EXPECT_EQ(configs[0].threads, 96);
  EXPECT_EQ(configs[1].threads, 64);
  EXPECT_EQ(configs[1].items, 2);
  EXPECT_EQ(configs[2].threads, 32);
  EXPECT_EQ(configs[2].items, 3);
  const auto k = emit_norm(spec, configs[0]);
  EXPECT_EQ(k.name.rfind("fact_layer_norm_bf16_bf16_", 0), 0u) << k.name;
  expect_golden(k, "norm_layer_norm_bf16_768_t96.cu");
}

// Launched as a programmatic dependent (FactNormArgs.pdl), a block waits for the kernel before
// it ahead of its first global read, and only in builds whose every architecture has the wait.
TEST(EmitNorm, EveryBlockWaitsForThePreviousKernelBeforeItsFirstRead) {
  const auto spec = NormSpec::from_pattern(norm_pattern("norm", "layer_norm", "bf16", 768, true, true));
  const auto k = emit_norm(spec, norm_configs(spec).at(0));
  const auto body = k.source.find("__global__ void __launch_bounds__(kThreads) fact_norm_kernel(");
  ASSERT_NE(body, std::string::npos);
  const auto wait = k.source.find("fact_wait_for_previous_grid();", body);
  ASSERT_NE(wait, std::string::npos);
  EXPECT_LT(wait, k.source.find("reinterpret_cast<const Pack<TIn>*>(xr)", body));
  EXPECT_NE(k.source.find("asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");"), std::string::npos);
  // no early trigger of the next kernel: once per block it cost 57 % of the kernel's time
  EXPECT_EQ(k.source.find("asm volatile(\"griddepcontrol.launch_dependents;"), std::string::npos);
  EXPECT_NE(k.source.find("config.numAttrs = dependent && kKernelsWait ? 1 : 0;"), std::string::npos);
  EXPECT_NE(k.source.find("fact_launch(\n      fact_norm_kernel,"), std::string::npos);
  EXPECT_NE(k.source.find("a->pdl != 0"), std::string::npos);
}

TEST(EmitNorm, HandWrittenRmsNormRoundsBeforeTheWeight) {
  const auto spec =
      NormSpec::from_pattern(norm_pattern("rms_norm_handwritten", "rms_norm", "bf16", 4096, true, false, "", "bf16"));
  EXPECT_TRUE(spec.round_before_weight);  // Llama: norm(x.float()).type_as(x) * weight
  EXPECT_NE(spec.id(), NormSpec::from_pattern(norm_pattern("rms_norm_handwritten", "rms_norm", "bf16", 4096, true,
                                                           false, "", "f16"))
                           .id());
  // Written out without the cast back: no rounding before the weight.
  EXPECT_FALSE(
      NormSpec::from_pattern(norm_pattern("rms_norm_handwritten", "rms_norm", "bf16", 4096, true, false, "f32"))
          .round_before_weight);
  const auto k = emit_norm(spec, norm_configs(spec)[1]);
  EXPECT_NE(k.source.find("constexpr bool kRoundBeforeWeight = true;"), std::string::npos);
  expect_golden(k, "norm_rms_norm_bf16_4096_t256.cu");
  // The same norm as one op (F.rms_norm) rounds once, at the output.
  const auto fused = NormSpec::from_pattern(norm_pattern("norm", "rms_norm", "bf16", 4096, true, false));
  EXPECT_FALSE(fused.round_before_weight);
  EXPECT_NE(fused.id(), spec.id());
}

TEST(EmitNorm, Fp32RowsUseFourWideVectors) {
  const auto spec = NormSpec::from_pattern(norm_pattern("norm", "layer_norm", "f32", 768, false, false));
  EXPECT_EQ(spec.vector_width(), 4);
  EXPECT_EQ(norm_configs(spec)[0].threads, 192);
  const auto k = emit_norm(spec, norm_configs(spec)[0]);
  EXPECT_NE(k.source.find("constexpr bool kHasWeight = false;"), std::string::npos);
}

TEST(EmitNorm, RowStatisticsWriteMeanAndRstd) {
  // A LayerNorm folded into the GEMMs after it: one read of x, two f32 columns written.
  json p = norm_pattern("norm", "layer_norm", "bf16", 768, false, false, "f32");
  p["attrs"]["stats"] = true;
  const auto spec = NormSpec::from_pattern(p);
  EXPECT_TRUE(spec.stats);
  EXPECT_NE(spec.id(), NormSpec::from_pattern(norm_pattern("norm", "layer_norm", "bf16", 768, false, false, "f32")).id());
  const auto k = emit_norm(spec, norm_configs(spec)[2]);
  EXPECT_EQ(k.name.rfind("fact_layer_norm_stats_bf16_f32_", 0), 0u) << k.name;
  expect_golden(k, "norm_layer_norm_stats_bf16_768_t32.cu");
  // Statistics of a norm with a weight, or in bf16, are not what the fold reads.
  json weighted = norm_pattern("norm", "layer_norm", "bf16", 768, true, false, "f32");
  weighted["attrs"]["stats"] = true;
  EXPECT_THROW(NormSpec::from_pattern(weighted), NotSupported);
  json rounded = norm_pattern("norm", "layer_norm", "bf16", 768, false, false, "bf16");
  rounded["attrs"]["stats"] = true;
  EXPECT_THROW(NormSpec::from_pattern(rounded), NotSupported);
}

TEST(EmitNorm, RefusedRowsSayWhy) {
  auto why = [](const json& p) {
    try {
      NormSpec::from_pattern(p);
    } catch (const NotSupported& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(why(norm_pattern("norm", "layer_norm", "bf16", 250, true, true)).find("not a multiple of 8"), std::string::npos);
  EXPECT_NE(why(norm_pattern("norm", "group_norm", "bf16", 256, true, true)).find("group_norm"), std::string::npos);
  EXPECT_NE(why(norm_pattern("norm", "layer_norm", "f64", 256, true, true)).find("f64"), std::string::npos);
}

}  // namespace
}  // namespace fact::realize
