// Emission of CUTLASS sm90 GEMM sources: golden files for several configs and epilogues, strict
// template substitution, and the patterns FACT refuses (with a reason) instead of miscompiling.
//
// Update the golden files after an intended change with FACT_UPDATE_GOLDEN=1 ctest -R Emit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ir/error.h"
#include "golden.h"
#include "families/gemm/candidates.h"
#include "families/gemm/emit.h"

namespace fact::realize {
namespace {

using nlohmann::json;

json operand(const std::string& role, const std::string& type, const std::string& broadcast = "") {
  json o = {{"role", role}, {"node", role + "_node"}, {"type", type}};
  if (!broadcast.empty()) o["broadcast"] = broadcast;
  return o;
}

// A plan pattern (docs/plan-format.md) with the fields emission reads.
json pattern(const std::string& dtype, const std::string& la, const std::string& lb, json ssa,
             std::vector<json> extra_operands, const std::string& text) {
  json ops = {operand("a", dtype + "[64, 32]"), operand("b", dtype + "[32, 48]")};
  for (auto& o : extra_operands) ops.push_back(o);
  return {{"family", "gemm"},
          {"attrs", {{"dtype_a", dtype}, {"dtype_b", dtype}, {"dtype_out", dtype}, {"layout_a", la}, {"layout_b", lb}}},
          {"operands", ops},
          {"epilogue_expr", {{"text", text}, {"ssa", ssa}}}};
}

json acc() { return {{"id", 0}, {"op", "acc"}}; }
json opnd(int id, int index) { return {{"id", id}, {"op", "operand"}, {"index", index}}; }
json fn(int id, const std::string& op, std::vector<int> args, json params = nullptr) {
  json e = {{"id", id}, {"op", op}, {"args", args}};
  if (!params.is_null()) e["params"] = params;
  return e;
}
json constant(int id, json value) { return {{"id", id}, {"op", "constant"}, {"value", value}}; }

using test::expect_golden;

GemmConfig config(int m, int n, int k, int cm, int cn, const std::string& sched, const std::string& scheduler = "persistent") {
  GemmConfig c;
  c.tile_m = m;
  c.tile_n = n;
  c.tile_k = k;
  c.cluster_m = cm;
  c.cluster_n = cn;
  c.kernel_schedule = sched;
  c.epilogue_schedule = sched == "cooperative" ? "tma_cooperative" : "tma";
  c.tile_scheduler = scheduler;
  return c;
}

TEST(Emit, PlainBf16GemmRowRowPingpong) {
  const auto spec = GemmSpec::from_pattern(pattern("bf16", "row", "row", json::array({acc()}), {}, "acc"));
  const auto k = emit_gemm_sm90(spec, config(128, 128, 64, 2, 1, "pingpong"));
  EXPECT_NE(k.name.find("fact_gemm_bf16_rr_"), std::string::npos);
  EXPECT_NE(k.name.find("_t128x128x64_c2x1_pp_tma_sauto_persistent"), std::string::npos);
  expect_golden(k, "gemm_bf16_rr_plain_pingpong.cu");
}

TEST(Emit, BiasGeluTanhCooperativeCluster) {
  const auto ssa = json::array({acc(), opnd(1, 0), fn(2, "add", {0, 1}), fn(3, "gelu_tanh", {2})});
  const auto spec = GemmSpec::from_pattern(
      pattern("bf16", "row", "col", ssa, {operand("bias", "bf16[48]", "row")}, "gelu_tanh(acc + bias)"));
  const auto k = emit_gemm_sm90(spec, config(128, 256, 64, 2, 1, "cooperative"));
  EXPECT_NE(k.source.find("Sm90RowBroadcast<0, TileShape, cutlass::bfloat16_t"), std::string::npos);
  // bf16 output: the tanh.approx path (its error is below bf16 rounding).
  EXPECT_NE(k.source.find("cutlass::fast_tanh(0.79788456080286536f"), std::string::npos);
  expect_golden(k, "gemm_bf16_rc_bias_gelu_tanh_coop.cu");
}

TEST(Emit, ResidualReadsTheFullOperandThroughC) {
  const auto ssa = json::array({acc(), opnd(1, 0), fn(2, "add", {0, 1}), opnd(3, 1), fn(4, "add", {3, 2})});
  const auto spec = GemmSpec::from_pattern(pattern(
      "f16", "row", "col", ssa, {operand("bias", "f16[48]", "row"), operand("x", "f16[64, 48]", "full")},
      "x + (acc + bias)"));
  const auto k = emit_gemm_sm90(spec, config(256, 128, 64, 1, 2, "cooperative"));
  EXPECT_NE(k.source.find("using ElementC = cutlass::half_t;"), std::string::npos);
  EXPECT_NE(k.source.find("Sm90SrcFetch<ElementC>"), std::string::npos);
  EXPECT_NE(k.source.find("const void* c_ptr = p->operands[1];"), std::string::npos);
  expect_golden(k, "gemm_f16_rc_bias_residual_coop.cu");
}

TEST(Emit, ColumnVectorScalarAndParamsOfActivations) {
  // leaky_relu((acc - col) * scale, 0.2), then clamp to [0, inf): params carry the constants,
  // an infinite bound included.
  const auto ssa = json::array({acc(), opnd(1, 0), fn(2, "sub", {0, 1}), opnd(3, 1), fn(4, "mul", {2, 3}),
                                fn(5, "leaky_relu", {4}, json::array({0.2})),
                                fn(6, "clamp", {5}, json::array({0.0, "inf"}))});
  const auto spec = GemmSpec::from_pattern(pattern(
      "bf16", "col", "col", ssa, {operand("col", "f32[64, 1]", "col"), operand("s", "f32[]", "scalar")},
      "clamp(leaky_relu((acc - col) * s))"));
  const auto k = emit_gemm_sm90(spec, config(128, 128, 64, 1, 1, "cooperative"));
  EXPECT_NE(k.source.find("Sm90ColBroadcast<0, TileShape, float"), std::string::npos);
  EXPECT_NE(k.source.find("Sm90ScalarBroadcast<float>"), std::string::npos);
  EXPECT_NE(k.source.find("v4 * 0.2f"), std::string::npos);
  EXPECT_NE(k.source.find("INFINITY"), std::string::npos);
  expect_golden(k, "gemm_bf16_cc_col_scalar_leaky_clamp.cu");
}

TEST(Emit, Tf32StreamKSplitsAreARuntimeKnob) {
  const auto spec = GemmSpec::from_pattern(pattern("f32", "row", "col", json::array({acc()}), {}, "acc"));
  auto c = config(128, 128, 32, 1, 1, "cooperative", "stream_k");
  c.math = "tf32";
  const auto k = emit_gemm_sm90(spec, c);
  EXPECT_NE(k.source.find("cutlass::gemm::StreamKScheduler"), std::string::npos);
  EXPECT_NE(k.source.find("a.scheduler.splits = p->splits"), std::string::npos);
  EXPECT_NE(k.source.find("p->reduction == 1 ? Reduction::Nondeterministic"), std::string::npos);
  EXPECT_NE(k.source.find("p->decomposition == 1 ? Decomposition::StreamK"), std::string::npos);
  EXPECT_NE(k.source.find("\"split-K (splits > 1) takes the heuristic decomposition\""), std::string::npos);
  EXPECT_EQ(k.source.find("needs a stream_k kernel"), std::string::npos);
  EXPECT_EQ(k.source.find("fast_tanh"), std::string::npos);  // f32 output keeps accurate libm
  // a persistent kernel refuses the stream-K knobs
  const auto p = emit_gemm_sm90(spec, config(128, 128, 32, 1, 1, "cooperative"));
  EXPECT_NE(p.source.find("\"a decomposition other than the heuristic needs a stream_k kernel\""), std::string::npos);
  EXPECT_EQ(p.source.find("Decomposition::"), std::string::npos);
  EXPECT_NE(p.source.find("\"a nondeterministic reduction needs a stream_k kernel\""), std::string::npos);
  EXPECT_NE(p.source.find("\"split-K needs a stream_k kernel\""), std::string::npos);
  expect_golden(k, "gemm_f32_rc_tf32_streamk.cu");
}

// fp32-accurate GEMMs under "highest": CUTLASS's sm80 multistage kernel with 3xTF32 MMAs and an
// sm80 epilogue visitor tree (row, column, scalar and full operands; the full one through an aux
// load), the same C ABI.
TEST(Emit, ThreeXTf32IsAnSm80KernelWithAVisitorEpilogue) {
  json ssa = json::array({acc(), opnd(1, 0), fn(2, "add", {0, 1}), opnd(3, 1), fn(4, "mul", {2, 3}), opnd(5, 2),
                          fn(6, "sub", {4, 5}), fn(7, "relu", {6}), opnd(8, 3), fn(9, "add", {7, 8})});
  const auto spec = GemmSpec::from_pattern(pattern(
      "f32", "row", "row", ssa,
      {operand("bias", "f32[48]", "row"), operand("s", "f32[64, 1]", "col"), operand("t", "f32[]", "scalar"),
       operand("r", "f32[64, 48]", "full")},
      "relu((acc + bias) * s - t) + r"));
  GemmConfig c;
  for (const auto& m : enumerate_multistage()) {
    if (m.tile_m == 128 && m.tile_n == 128 && m.tile_k == 16 && m.stages == 4) c = m;
  }
  ASSERT_EQ(c.name(), "t128x128x16_c1x1_ms_evt_s4_grid_3xtf32");
  EXPECT_TRUE(GemmConfig::is_name(c.name()));
  const auto k = emit_gemm(spec, c);
  EXPECT_EQ(k.name.rfind("fact_gemm_f32_rr_", 0), 0u) << k.name;
  EXPECT_NE(k.source.find("cutlass::arch::OpMultiplyAddFastF32"), std::string::npos);
  EXPECT_NE(k.source.find("GemmShape<128 / 4, 128 / 2, 16>"), std::string::npos);  // 4x2 warps of 32x64
  EXPECT_NE(k.source.find("VisitorRowBroadcast<OutputTileThreadMap, float"), std::string::npos);
  EXPECT_NE(k.source.find("VisitorColBroadcast<OutputTileThreadMap, float"), std::string::npos);
  EXPECT_NE(k.source.find("VisitorScalarBroadcast<float>"), std::string::npos);
  EXPECT_NE(k.source.find("VisitorAuxLoad<OutputTileThreadMap, float"), std::string::npos);
  EXPECT_EQ(k.source.find("Sm90"), std::string::npos);
  EXPECT_EQ(k.source.find("fast_tanh"), std::string::npos);  // f32 output keeps accurate libm
  EXPECT_NE(k.source.find("\"math\":\"3xtf32\""), std::string::npos);  // kernel info says the math
  EXPECT_NE(k.source.find("\"split-K needs a stream_k kernel (this is an sm80 kernel)\""), std::string::npos);
  expect_golden(k, "gemm_f32_rr_3xtf32_row_col_scalar_full_multistage.cu");
}

TEST(Emit, LaunchKnobsNameAndJsonCarryTheReduction) {
  LaunchKnobs k;
  EXPECT_EQ(k.name(), "r_heur_s1_k1");
  EXPECT_FALSE(k.to_json().contains("reduction"));  // deterministic: the default, left out
  k.raster = "along_m";
  k.splits = 4;
  k.reduction = "nondeterministic";
  EXPECT_EQ(k.name(), "r_m_s1_k4_nd");
  EXPECT_EQ(k.to_json(), json({{"raster", "along_m"}, {"max_swizzle", 1}, {"splits", 4},
                               {"reduction", "nondeterministic"}}));
  k.splits = 1;
  k.decomposition = "stream_k";
  EXPECT_EQ(k.name(), "r_m_s1_k1_nd_sk");
  EXPECT_EQ(k.to_json().at("decomposition"), "stream_k");
  k.decomposition = "data_parallel";
  EXPECT_EQ(k.name(), "r_m_s1_k1_nd_dp");
}

TEST(Emit, KernelNameChangesWithTheEpilogueButNotWithNodeNames) {
  auto ssa = json::array({acc(), opnd(1, 0), fn(2, "add", {0, 1})});
  auto p1 = pattern("bf16", "row", "col", ssa, {operand("bias", "bf16[48]", "row")}, "acc + bias");
  auto p2 = p1;
  p2["operands"][2]["node"] = "another_bias";
  auto p3 = pattern("bf16", "row", "col", json::array({acc(), opnd(1, 0), fn(2, "mul", {0, 1})}),
                    {operand("bias", "bf16[48]", "row")}, "acc * bias");
  const auto c = config(128, 128, 64, 1, 1, "cooperative");
  const auto k1 = emit_gemm_sm90(GemmSpec::from_pattern(p1), c);
  EXPECT_EQ(k1.name, emit_gemm_sm90(GemmSpec::from_pattern(p2), c).name);  // one binary serves both
  EXPECT_NE(k1.name, emit_gemm_sm90(GemmSpec::from_pattern(p3), c).name);
}

TEST(Emit, UnsupportedPatternsSayWhy) {
  auto two_full = pattern("bf16", "row", "col",
                          json::array({acc(), opnd(1, 0), fn(2, "add", {0, 1}), opnd(3, 1), fn(4, "add", {2, 3})}),
                          {operand("x", "bf16[64, 48]", "full"), operand("y", "bf16[64, 48]", "full")}, "");
  EXPECT_THROW(GemmSpec::from_pattern(two_full), NotSupported);
  auto attention = pattern("bf16", "row", "col", json::array({acc()}), {}, "acc");
  attention["family"] = "attention";
  EXPECT_THROW(GemmSpec::from_pattern(attention), NotSupported);
  auto strided = pattern("bf16", "strided", "col", json::array({acc()}), {}, "acc");
  EXPECT_THROW(GemmSpec::from_pattern(strided), NotSupported);
  // tf32 with an MN-major operand: built by CUTLASS but wrong on the H200 (see emit.cpp). The
  // sm80 3xTF32 kernels take any layout.
  const auto row_row = GemmSpec::from_pattern(pattern("f32", "row", "row", json::array({acc()}), {}, "acc"));
  auto tf32 = config(128, 128, 32, 1, 1, "cooperative");
  tf32.math = "tf32";
  EXPECT_THROW(emit_gemm_sm90(row_row, tf32), NotSupported);
  EXPECT_NO_THROW(emit_gemm(row_row, enumerate_multistage().at(0)));
  const auto spec = GemmSpec::from_pattern(pattern("f32", "row", "col", json::array({acc()}), {}, "acc"));
  auto c = config(128, 128, 32, 1, 1, "cooperative");
  c.math = "3xtf32";  // 3xTF32 has no sm90 kernel in CUTLASS
  EXPECT_THROW(emit_gemm_sm90(spec, c), NotSupported);
  EXPECT_THROW(emit_gemm_sm80(spec, c), NotSupported);  // not a multistage config
  auto ms = enumerate_multistage().at(0);
  ms.math = "tf32";
  EXPECT_THROW(emit_gemm_sm80(spec, ms), NotSupported);  // sm80 kernels are for 3xTF32 only
  ms = enumerate_multistage().at(0);
  ms.stages = 2;
  EXPECT_THROW(emit_gemm_sm80(spec, ms), NotSupported);
  const auto bf16 = GemmSpec::from_pattern(pattern("bf16", "row", "col", json::array({acc()}), {}, "acc"));
  EXPECT_THROW(emit_gemm_sm80(bf16, enumerate_multistage().at(0)), NotSupported);
  auto cast_int = pattern("bf16", "row", "col",
                          json::array({acc(), json{{"id", 1}, {"op", "cast"}, {"args", {0}}, {"dtype", "i32"}}}), {}, "");
  EXPECT_THROW(emit_gemm_sm90(GemmSpec::from_pattern(cast_int), c), NotSupported);
}

// A horizontal GEMM (q, k, v projections of one input): CUTLASS's grouped ptr-array kernel over
// the parts' own weights; a bias per part goes through a [parts, max n] copy in the workspace.
json horizontal(const std::string& dtype, bool bias) {
  json ops = {operand("a", dtype + "[64, 32]"), operand("b", dtype + "[48, 32]")};
  if (bias) ops.push_back(operand("bias", dtype + "[48]", "row"));
  ops.push_back(operand("b", dtype + "[16, 32]"));
  return {{"family", "horizontal_gemm"},
          {"attrs", {{"dtype_a", dtype}, {"dtype_b", dtype}, {"dtype_out", dtype}, {"layout_a", "row"}, {"layout_b", "col"}}},
          {"operands", ops},
          {"problem", {{"batch", 1}, {"m", 64}, {"n", 64}, {"k", 32}, {"n_parts", {48, 16}}}}};
}

TEST(Emit, HorizontalGemmIsAGroupedKernelOverThePartsWeights) {
  const auto spec = GemmSpec::from_pattern(horizontal("bf16", true));
  const auto k = emit_gemm(spec, config(128, 128, 64, 2, 1, "cooperative", "group"));
  EXPECT_NE(k.name.find("_t128x128x64_c2x1_coop_tmacoop_sauto_group"), std::string::npos);
  EXPECT_NE(k.source.find("cutlass::gemm::GroupProblemShape<Shape<int, int, int>>"), std::string::npos);
  EXPECT_NE(k.source.find("cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative"), std::string::npos);
  EXPECT_NE(k.source.find("constexpr bool kHasBias = true;"), std::string::npos);
  EXPECT_NE(k.source.find("{_0{}, _1{}, parts.max_n}"), std::string::npos);  // row p: part p's bias
  EXPECT_EQ(k.source.find("${"), std::string::npos);
  expect_golden(k, "gemm_grouped_bf16_rc_bias_coop.cu");
  // Without a bias the tree is the accumulator alone; pingpong takes the ptr-array pingpong pair.
  const auto plain = emit_gemm(GemmSpec::from_pattern(horizontal("f16", false)), config(128, 64, 64, 1, 1, "pingpong", "group"));
  EXPECT_NE(plain.source.find("constexpr bool kHasBias = false;"), std::string::npos);
  EXPECT_NE(plain.source.find("cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong"), std::string::npos);
  EXPECT_EQ(plain.source.find("Sm90RowBroadcast"), std::string::npos);
  // Other schedulers, 3xTF32 and non-K-major TF32 have no grouped form.
  EXPECT_THROW(emit_gemm(spec, config(128, 128, 64, 2, 1, "cooperative")), NotSupported);
  auto f32 = config(128, 128, 32, 1, 1, "cooperative", "group");
  f32.math = "3xtf32";
  EXPECT_THROW(emit_gemm(GemmSpec::from_pattern(horizontal("f32", false)), f32), NotSupported);
  // and a plain GEMM never takes the group scheduler's template
  const auto gemm = GemmSpec::from_pattern(pattern("bf16", "row", "col", json::array({acc()}), {}, "acc"));
  EXPECT_THROW(emit_gemm_grouped_sm90(gemm, config(128, 128, 64, 1, 1, "cooperative", "group")), NotSupported);
}

// Programmatic dependent launch: an sm90 kernel may be launched before its predecessor ends
// only because CUTLASS's load warps wait for it, which they do only with the macro defined
// before CUTLASS's headers; a build without the wait is an error, not a race. The sm80 and
// grouped templates' kernels have no wait and never launch so.
TEST(Emit, OnlyKernelsThatWaitForTheirPredecessorLaunchAsItsDependents) {
  const auto spec = GemmSpec::from_pattern(pattern("bf16", "row", "col", json::array({acc()}), {}, "acc"));
  const auto k = emit_gemm_sm90(spec, config(128, 128, 64, 1, 1, "cooperative"));
  const auto define = k.source.find("#define CUTLASS_ENABLE_GDC_FOR_SM90");
  ASSERT_NE(define, std::string::npos);
  EXPECT_LT(define, k.source.find("#include \"cute/tensor.hpp\""));
  EXPECT_NE(k.source.find("#if defined(__CUDA_ARCH__) && defined(CUTLASS_ENABLE_GDC_FOR_SM90) && "
                          "!defined(CUTLASS_GDC_ENABLED)\n#error"),
            std::string::npos);
  EXPECT_NE(k.source.find("constexpr bool kDependentLaunch = true;"), std::string::npos);
  EXPECT_NE(k.source.find("return Gemm::run(params, s, nullptr, dependent);"), std::string::npos);
  EXPECT_NE(k.source.find("kDependentLaunch && p->pdl != 0"), std::string::npos);

  // A scalar operand is read by every warp at kernel entry (CUTLASS's scalar broadcast node
  // loads it in its constructor), before any wait: that kernel launches plainly.
  const auto ssa = json::array({acc(), opnd(1, 0), fn(2, "mul", {0, 1})});
  const auto scaled = emit_gemm_sm90(
      GemmSpec::from_pattern(pattern("bf16", "row", "col", ssa, {operand("s", "bf16[]", "scalar")}, "acc * s")),
      config(128, 128, 64, 1, 1, "cooperative"));
  EXPECT_NE(scaled.source.find("Sm90ScalarBroadcast<"), std::string::npos);
  EXPECT_NE(scaled.source.find("constexpr bool kDependentLaunch = false;"), std::string::npos);

  // A stream-K kernel launches plainly (its workspace reset comes between it and the kernel
  // before) and is built without the macro: CUTLASS 4.2's stream-K scheduler does not compile
  // with it, so every stream-K candidate failed to build while it was defined.
  const auto streamk = emit_gemm_sm90(spec, config(128, 128, 64, 2, 2, "cooperative", "stream_k"));
  EXPECT_NE(streamk.source.find("cutlass::gemm::StreamKScheduler"), std::string::npos);
  EXPECT_EQ(streamk.source.find("#define CUTLASS_ENABLE_GDC_FOR_SM90"), std::string::npos);
  EXPECT_NE(streamk.source.find("constexpr bool kDependentLaunch = false;"), std::string::npos);

  const auto sm80 = emit_gemm(GemmSpec::from_pattern(pattern("f32", "row", "col", json::array({acc()}), {}, "acc")),
                              enumerate_multistage().at(0));
  EXPECT_NE(sm80.source.find("constexpr bool kDependentLaunch = false;"), std::string::npos);
  EXPECT_EQ(sm80.source.find("CUTLASS_ENABLE_GDC_FOR_SM90"), std::string::npos);

  const auto grouped = emit_gemm(GemmSpec::from_pattern(horizontal("bf16", true)), config(128, 128, 64, 2, 1, "cooperative", "group"));
  EXPECT_EQ(grouped.source.find("CUTLASS_ENABLE_GDC_FOR_SM90"), std::string::npos);
  EXPECT_NE(grouped.source.find("run_gemm(args, static_cast<char*>(workspace) + l.total, s, false)"),
            std::string::npos);
}

// CUTLASS looks up the driver's TMA encode function before every descriptor of every launch
// unless CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL is defined before its headers; the sm90
// templates define it and the function (looked up once), and run CUTLASS's initialize() (which
// sets the shared-memory attribute) once per device instead of at every launch.
TEST(Emit, Sm90KernelsLookUpTheDriverOnceAndSetTheirAttributesOnce) {
  const auto spec = GemmSpec::from_pattern(pattern("bf16", "row", "col", json::array({acc()}), {}, "acc"));
  const auto grouped = emit_gemm(GemmSpec::from_pattern(horizontal("bf16", true)), config(128, 128, 64, 2, 1, "cooperative", "group"));
  for (const auto& k : {emit_gemm_sm90(spec, config(128, 128, 64, 1, 1, "cooperative")), grouped}) {
    const auto define = k.source.find("#define CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL 1");
    ASSERT_NE(define, std::string::npos) << k.name;
    EXPECT_LT(define, k.source.find("#include \"cute/tensor.hpp\"")) << k.name;
    EXPECT_NE(k.source.find("CUresult CUDAAPI cuTensorMapEncodeTiled("), std::string::npos) << k.name;
    EXPECT_NE(k.source.find("if (status == cutlass::Status::kSuccess) done[device].store(true"), std::string::npos) << k.name;
    EXPECT_NE(k.source.find("return Gemm::run(params, s, nullptr, dependent);"), std::string::npos) << k.name;
  }
  const auto sm80 = emit_gemm(GemmSpec::from_pattern(pattern("f32", "row", "col", json::array({acc()}), {}, "acc")),
                              enumerate_multistage().at(0));
  EXPECT_EQ(sm80.source.find("CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL"), std::string::npos);
}

TEST(Emit, GatedMlpLowersToTheGateGemmWithActTimesUp) {
  json gated = {{"family", "gated_mlp"},
                {"rule", "gated_mlp"},
                {"nodes", {"gate", "act", "up", "prod"}},
                {"anchors", {"gate", "up"}},
                {"output", "prod"},
                {"problem", {{"batch", 1}, {"m", 64}, {"n", 96}, {"k", 32}}},
                {"attrs", {{"activation", "silu"}, {"dtype_a", "bf16"}, {"dtype_b", "bf16"}, {"dtype_out", "bf16"},
                           {"layout_a", "row"}, {"layout_b", "col"}, {"gate", "gate"}, {"up", "up"}}},
                {"operands", {operand("a", "bf16[2, 32, 32]"), operand("b_gate", "bf16[96, 32]"),
                              operand("b_up", "bf16[96, 32]")}},
                {"signature", "gated_mlp[silu+mul]:bf16,bf16->bf16:row,col"}};
  const json g = lower_gated_mlp(gated);
  EXPECT_EQ(g["family"], "gemm");
  EXPECT_EQ(g["signature"], "gemm[silu+mul]:bf16,bf16->bf16:row,col");
  EXPECT_EQ(g["epilogue_expr"]["text"], "silu(acc) * up");
  ASSERT_EQ(g["operands"].size(), 3u);
  EXPECT_EQ(g["operands"][1]["role"], "b");
  EXPECT_EQ(g["operands"][2], json({{"role", "up"}, {"node", "up"}, {"type", "bf16[2, 32, 96]"}, {"broadcast", "full"}}));
  const auto spec = GemmSpec::from_pattern(g);  // emission takes it as any GEMM pattern
  ASSERT_EQ(spec.operands.size(), 1u);
  EXPECT_EQ(spec.operands[0].kind, "full");
  auto odd = gated;
  odd["attrs"]["activation"] = "softsign";
  EXPECT_THROW(lower_gated_mlp(odd), NotSupported);
}

TEST(Substitute, IsStrict) {
  EXPECT_EQ(substitute("a ${x} b ${y}", {{"x", "1"}, {"y", "2"}}), "a 1 b 2");
  EXPECT_THROW(substitute("a ${x} ${z}", {{"x", "1"}}), InternalError);        // no value for z
  EXPECT_THROW(substitute("a ${x}", {{"x", "1"}, {"unused", "2"}}), InternalError);  // leftover var
  EXPECT_THROW(substitute("a ${x", {{"x", "1"}}), InternalError);               // unterminated
}

}  // namespace
}  // namespace fact::realize
