// Kernel candidates for GEMM-family matches on sm90: the literal lists, the constraint filter
// and its reasons, the wave-model ranking, registry boosts and the top-N cut.
#include <gtest/gtest.h>

#include <array>
#include <set>

#include "ir/error.h"
#include "families/gemm/candidates.h"
#include "families/gemm/emit.h"
#include "registry/registry.h"
#include "scratch_dir.h"

namespace fact::realize {
namespace {

using discover::Family;
using nlohmann::json;

discover::Match gemm_match(int64_t m, int64_t n, int64_t k, const std::string& dtype = "bf16") {
  discover::Match mt;
  mt.rule = "gemm";
  mt.family = Family::gemm;
  mt.epilogue = {"bias"};
  mt.problem = {{"batch", 1}, {"m", m}, {"n", n}, {"k", k}};
  mt.attrs = {{"dtype_a", dtype},    {"dtype_b", dtype},    {"dtype_out", dtype},
              {"layout_a", "row"},   {"layout_b", "col"},   {"accumulate", "f32"}};
  return mt;
}

GemmConfig cfg(int tm, int tn, int tk, const std::string& schedule = "cooperative", int stages = 0,
               const std::string& scheduler = "persistent") {
  GemmConfig c;
  c.tile_m = tm;
  c.tile_n = tn;
  c.tile_k = tk;
  c.kernel_schedule = schedule;
  c.epilogue_schedule = schedule == "cooperative" ? "tma_cooperative" : "tma";
  c.stages = stages;
  c.tile_scheduler = scheduler;
  return c;
}

GemmProblem bf16_problem(int64_t m, int64_t n, int64_t k) { return GemmProblem::from_match(gemm_match(m, n, k)); }

// A registry row: `config` measured in `us` on the match's problem (provenance "tuned").
registry::Row tuned_row(const std::string& signature, const json& problem, const GemmConfig& config, double us) {
  registry::Row row;
  row.signature = signature;
  row.arch = "sm90";
  row.problem = problem;
  row.config = config.to_json();
  row.time_us = us;
  row.provenance = "tuned";
  return row;
}

// The one config's fate: "" when kept, else its drop reason.
std::string verdict(const GemmProblem& p, const GemmConfig& c) {
  const auto r = filter_sm90(p, {c});
  return r.kept.empty() ? r.dropped.at(0).reason : "";
}

TEST(Candidates, ProblemFromMatch) {
  const auto p = bf16_problem(4096, 3072, 768);
  EXPECT_EQ(p.family, "gemm");
  EXPECT_EQ(p.m, 4096);
  EXPECT_EQ(p.k, 768);
  EXPECT_EQ(p.b_operands, 1);
  auto g = gemm_match(64, 64, 64);
  g.family = Family::gated_mlp;
  EXPECT_EQ(GemmProblem::from_match(g).b_operands, 2);
  auto attn = gemm_match(64, 64, 64);
  attn.family = Family::attention;
  EXPECT_THROW(GemmProblem::from_match(attn), UserError);
  EXPECT_FALSE(supports_candidates(attn, "sm90"));
  EXPECT_FALSE(supports_candidates(gemm_match(64, 64, 64), "sm80"));
  CandidateOptions sm80;
  sm80.arch = "sm80";
  EXPECT_THROW(candidates(gemm_match(64, 64, 64), sm80), UserError);
}

TEST(Candidates, ProblemFromMatchHasNoDefaults) {
  // Emission reads dtypes and layouts strictly; ranking must not assume any either.
  for (const char* key : {"dtype_b", "dtype_out", "layout_a", "layout_b"}) {
    auto m = gemm_match(256, 256, 256);
    m.attrs.erase(key);
    try {
      GemmProblem::from_match(m);
      ADD_FAILURE() << key << ": no error";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

TEST(Candidates, EnumerationIsTheLiteralList) {
  const auto p = bf16_problem(8192, 8192, 4096);
  const auto all = enumerate_sm90(p);
  // Every tile, cluster and schedule once as a persistent kernel (tiles m x n x k, clusters,
  // schedules), and a stream_k twin where its tiles leave the last wave partly idle (4096 tiles
  // of 128x128 leave 4 on 132 SMs), for the decomposition knob.
  std::set<std::string> names;
  size_t persistent = 0;
  for (const auto& c : all) {
    names.insert(c.name());
    EXPECT_EQ(c.stages, 0);
    EXPECT_TRUE(c.tile_k == 64 || c.tile_k == 128);
    EXPECT_EQ(c.epilogue_schedule, c.kernel_schedule == "cooperative" ? "tma_cooperative" : "tma");
    if (c.tile_scheduler == "persistent") {
      ++persistent;
      continue;
    }
    EXPECT_EQ(c.tile_scheduler, "stream_k");
    auto twin = c;
    twin.tile_scheduler = "persistent";
    EXPECT_NE(std::find(all.begin(), all.end(), twin), all.end()) << c.name();
    const int64_t tiles = (8192 / c.tile_m) * (8192 / c.tile_n);  // every count here divides by the cluster
    EXPECT_NE(tiles % sm90_cluster_sms(c.cluster_m * c.cluster_n), 0) << c.name();
  }
  EXPECT_EQ(persistent, 3u * 3u * 2u * 4u * 2u);
  EXPECT_GT(all.size(), persistent);
  EXPECT_EQ(names.size(), all.size());
  // 4224 x 512 in 128x128 tiles: 33 x 4, one whole wave of 132 CTAs without a cluster or with
  // 1x2, so those configs have no stream_k twin; 2x1 and 2x2 clusters round the 33 rows up to
  // 34 (136 CTAs, on 132 or 120 SMs): a partial wave, so a twin.
  std::set<std::string> twins;
  for (const auto& c : enumerate_sm90(bf16_problem(4224, 512, 4096))) {
    if (c.tile_m == 128 && c.tile_n == 128 && c.tile_scheduler == "stream_k") {
      twins.insert(std::to_string(c.cluster_m) + "x" + std::to_string(c.cluster_n));
    }
  }
  EXPECT_EQ(twins, (std::set<std::string>{"2x1", "2x2"}));
  EXPECT_TRUE(names.count("t128x128x64_c2x1_coop_tmacoop_sauto_persistent"));

  // f32: tile_k 32 and TF32 WGMMAs where the precision allows TF32; where it asks for
  // fp32-accurate results, CUTLASS's 3xTF32 list of sm80 multistage kernels.
  const auto f32 = GemmProblem::from_match(gemm_match(8192, 8192, 4096, "f32"));
  for (const auto& c : enumerate_sm90(f32, "high")) {
    EXPECT_EQ(c.tile_k, 32);
    EXPECT_EQ(c.math, "tf32");
  }
  const auto accurate = enumerate_sm90(f32, "highest");
  EXPECT_EQ(accurate.size(), 13u);
  for (const auto& c : accurate) {
    EXPECT_EQ(c.kernel_schedule, "multistage");
    EXPECT_EQ(c.math, "3xtf32");
    EXPECT_TRUE(GemmConfig::is_name(c.name())) << c.name();
    EXPECT_EQ(verdict(f32, c), "") << c.name();  // CUTLASS's own list passes the filter
  }

  // Long K (k >= 8 max(m, n)): every config also gets a stream_k twin.
  const auto long_k = enumerate_sm90(bf16_problem(512, 512, 8192));
  EXPECT_EQ(long_k.size(), 2 * persistent);
  // Otherwise stream_k only where a config's CTAs leave the last wave partly idle (less than
  // one wave included). 2112 x 512: 64x64 tiles make 33 x 8, two whole waves of 132 without a
  // cluster or with 1x2; 2x1 and 2x2 clusters round 33 up to 34 (272 CTAs, partial on 132 or
  // 120 SMs). 256x256 tiles make 18.
  size_t sk_64x64 = 0, sk_64x64_c2m = 0, sk_256x256 = 0;
  for (const auto& c : enumerate_sm90(bf16_problem(2112, 512, 1024))) {
    if (c.tile_scheduler != "stream_k") continue;
    if (c.tile_m == 64 && c.tile_n == 64) ++(c.cluster_m == 2 ? sk_64x64_c2m : sk_64x64);
    sk_256x256 += c.tile_m == 256 && c.tile_n == 256;
  }
  EXPECT_EQ(sk_64x64, 0u);
  EXPECT_EQ(sk_64x64_c2m, 2u * 2u * 2u);  // tile_k x clusters (2x1, 2x2) x schedules
  EXPECT_EQ(sk_256x256, 2u * 4u * 2u);    // tile_k x clusters x schedules
}

TEST(Candidates, SharedMemoryOverflowIsDropped) {
  const auto p = bf16_problem(4096, 4096, 4096);
  // 256x256x128 bf16: 128 KB a stage; 4 stages need over 512 KB.
  const auto many = verdict(p, cfg(256, 256, 128, "cooperative", 4));
  EXPECT_NE(many.find("shared memory"), std::string::npos) << many;
  EXPECT_NE(many.find("4 stages"), std::string::npos) << many;
  // Not even 2 stages fit, so the auto stage count cannot save it either.
  const auto autos = verdict(p, cfg(256, 256, 128));
  EXPECT_NE(autos.find("shared memory"), std::string::npos) << autos;
  EXPECT_NE(autos.find("for 2 stages"), std::string::npos) << autos;
  // 128x256x128: 96 KB a stage. Auto fits 2, a fixed 3 does not; the registers are fine.
  EXPECT_EQ(verdict(p, cfg(128, 256, 128)), "");
  const auto three = verdict(p, cfg(128, 256, 128, "cooperative", 3));
  EXPECT_NE(three.find("shared memory"), std::string::npos) << three;
  EXPECT_EQ(three.find("registers"), std::string::npos) << three;
  // The estimate itself.
  const auto s = smem_sm90(p, cfg(128, 128, 64));
  EXPECT_EQ(s.stage_bytes, 128 * 64 * 2 * 2 + 16);
  EXPECT_EQ(s.epilogue_bytes, 2 * 128 * 32 * 2 + 1024);
  EXPECT_EQ(s.stages, (kSm90SmemPerCta - s.epilogue_bytes) / s.stage_bytes);
  EXPECT_LE(s.total_bytes, kSm90SmemPerCta);
  EXPECT_NE(verdict(p, cfg(128, 128, 64, "cooperative", 1)).find("at least 2"), std::string::npos);
}

TEST(Candidates, ScheduleRulesAreEnforced) {
  const auto p = bf16_problem(4096, 4096, 4096);
  const auto coop64 = verdict(p, cfg(64, 128, 64, "cooperative"));
  EXPECT_NE(coop64.find("cooperative"), std::string::npos) << coop64;
  EXPECT_NE(coop64.find("tile_m >= 128"), std::string::npos) << coop64;
  const auto pp256 = verdict(p, cfg(256, 64, 64, "pingpong"));
  EXPECT_NE(pp256.find("pingpong"), std::string::npos) << pp256;
  EXPECT_NE(pp256.find("tile_m <= 128"), std::string::npos) << pp256;
  EXPECT_EQ(verdict(p, cfg(64, 128, 64, "pingpong")), "");
  EXPECT_EQ(verdict(p, cfg(128, 128, 64, "pingpong")), "");
  EXPECT_EQ(verdict(p, cfg(256, 128, 64, "cooperative")), "");
  // Mismatched epilogue.
  auto c = cfg(128, 128, 64, "cooperative");
  c.epilogue_schedule = "tma";
  EXPECT_NE(verdict(p, c).find("tma_cooperative epilogue"), std::string::npos);
  // Clusters of more than 4 CTAs.
  c = cfg(128, 128, 64);
  c.cluster_m = 4;
  c.cluster_n = 2;
  EXPECT_NE(verdict(p, c).find("at most 4 CTAs"), std::string::npos);
}

TEST(Candidates, AccumulatorsMustFitRegisters) {
  const auto p = bf16_problem(4096, 4096, 4096);
  // 256x256 cooperative: 65536 accumulators over 256 threads = 256 each.
  const auto coop = verdict(p, cfg(256, 256, 64, "cooperative"));
  EXPECT_NE(coop.find("registers"), std::string::npos) << coop;
  EXPECT_NE(coop.find("256 fp32 accumulators per thread"), std::string::npos) << coop;
  // 128x256 pingpong: one warpgroup holds the whole tile, 256 each. Cooperative halves it.
  EXPECT_NE(verdict(p, cfg(128, 256, 64, "pingpong")).find("registers"), std::string::npos);
  EXPECT_EQ(verdict(p, cfg(128, 256, 64, "cooperative")), "");
  EXPECT_EQ(verdict(p, cfg(64, 256, 64, "pingpong")), "");
  // Gated MLP keeps two accumulators: 256x128 cooperative no longer fits.
  auto g = gemm_match(4096, 4096, 4096);
  g.family = Family::gated_mlp;
  const auto gated = GemmProblem::from_match(g);
  EXPECT_NE(verdict(gated, cfg(256, 128, 64, "cooperative")).find("x2 accumulators"), std::string::npos);
  EXPECT_EQ(verdict(gated, cfg(128, 128, 64, "cooperative")), "");
}

TEST(Candidates, MisalignedProblemDropsEverything) {
  // Row-major A with K = 4095 bf16: 8190-byte rows, not a multiple of 16. No config can run.
  const auto p = bf16_problem(4096, 4096, 4095);
  const auto f = filter_sm90(p, enumerate_sm90(p));
  EXPECT_TRUE(f.kept.empty());
  for (const auto& d : f.dropped) {
    EXPECT_NE(d.reason.find("K*2 bytes is not a multiple of 16"), std::string::npos) << d.reason;
  }
  // So the pattern gets no kernel, and says why: the reason every config shares.
  const auto c = candidates(gemm_match(4096, 4096, 4095));
  EXPECT_TRUE(c.ranked.empty());
  EXPECT_EQ(c.kept, 0u);
  ASSERT_EQ(c.dropped.size(), c.enumerated);
  const auto why = why_none_kept(c.dropped);
  EXPECT_NE(why.find("every one of the " + std::to_string(c.dropped.size()) + " configs was dropped: "),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("K*2 bytes is not a multiple of 16"), std::string::npos) << why;
  EXPECT_EQ(why.find("cooperative splits"), std::string::npos) << why;  // not shared by all
  // TF32 with a row-major B: the WGMMA's K-major rule, which every config breaks.
  auto row_b = gemm_match(4096, 4096, 4096, "f32");
  row_b.attrs["layout_b"] = "row";
  CandidateOptions high;
  high.precision = "high";
  const auto tf32 = candidates(row_b, high);
  EXPECT_TRUE(tf32.ranked.empty());
  EXPECT_NE(why_none_kept(tf32.dropped).find("TF32 WGMMA kernels need K-major operands"), std::string::npos);
  // No shared reason: the most frequent, counted.
  const std::vector<Dropped> mixed = {{cfg(64, 64, 64), "a; b"}, {cfg(128, 64, 64), "b"}, {cfg(64, 128, 64), "c"}};
  EXPECT_EQ(why_none_kept(mixed), "every one of the 3 configs was dropped; most often (2 of them): b");
  EXPECT_EQ(why_none_kept({}), "no config to build");
  // N of the output (and a column-major B's K) are checked the same way.
  EXPECT_NE(verdict(bf16_problem(4096, 4100, 4096), cfg(128, 128, 64)).find("N*2 bytes"), std::string::npos);
  // f32 needs multiples of 4 elements, bf16 of 8.
  EXPECT_EQ(verdict(GemmProblem::from_match(gemm_match(4096, 4096, 4092, "f32")),
                    [] {
                      auto c = cfg(128, 128, 32);
                      c.math = "tf32";
                      return c;
                    }()),
            "");
  // A strided operand has no unit-stride dimension for TMA.
  auto s = gemm_match(4096, 4096, 4096);
  s.attrs["layout_a"] = "strided";
  EXPECT_NE(verdict(GemmProblem::from_match(s), cfg(128, 128, 64)).find("A is strided"), std::string::npos);
}

TEST(Candidates, FullWaveRanksAheadOfMostlyEmptyLastWave) {
  // m = 11 x 128, n = 24 x 128. 128x128 tiles: 264 = exactly 2 waves on 132 SMs. 256x128 tiles:
  // 6 x 24 = 144, so a second wave with 12 tiles and 120 idle SMs.
  const auto p = bf16_problem(1408, 3072, 4096);
  const auto full = cfg(128, 128, 64);
  const auto ragged = cfg(256, 128, 64);
  const auto ranked = rank_sm90(p, {ragged, full});
  ASSERT_EQ(ranked.size(), 2u);
  EXPECT_EQ(ranked[0].config, full);
  EXPECT_LT(ranked[0].score, ranked[1].score);
  EXPECT_NE(ranked[0].reasons.back().find("264 tiles: 2 waves, last 100% full"), std::string::npos)
      << ranked[0].reasons.back();
  bool ragged_reason = false;
  for (const auto& r : ranked[1].reasons) ragged_reason |= r.find("144 tiles: 2 waves") != std::string::npos;
  EXPECT_TRUE(ragged_reason);
  // With one full wave of the bigger tile instead, the bigger (more efficient) tile wins.
  const auto q = bf16_problem(256 * 11, 128 * 12, 4096);  // 132 tiles of 256x128
  EXPECT_EQ(rank_sm90(q, {full, ragged})[0].config, ragged);
}

TEST(Candidates, ClustersOfFourLeaveSmsIdleAndMulticastFavoursASquareFootprint) {
  // Llama-3-8B's MLP down projection: 1024 tiles of 128x256, eight waves. Measured on the H200
  // (bench/results/2026-11-30-clusters/): 128x256 with a 2x1 cluster and 256x128 with 1x2 led,
  // 2x2 clusters (30 fit at once: 120 SMs) trailed by 6%.
  const auto p = bf16_problem(8192, 4096, 14336);
  auto with = [](GemmConfig c, int cm, int cn) {
    c.cluster_m = cm;
    c.cluster_n = cn;
    return c;
  };
  const auto wide = cfg(128, 256, 64), tall = cfg(256, 128, 64);
  const auto ranked = rank_sm90(p, {with(wide, 2, 2), with(wide, 1, 2), with(tall, 2, 1), with(wide, 2, 1),
                                    with(tall, 1, 2), with(tall, 2, 2)});
  ASSERT_EQ(ranked.size(), 6u);
  const std::set<std::string> first{ranked[0].config.name(), ranked[1].config.name()};
  EXPECT_EQ(first, (std::set<std::string>{with(wide, 2, 1).name(), with(tall, 1, 2).name()}));
  EXPECT_EQ(ranked[4].config.cluster_m * ranked[4].config.cluster_n, 4);
  EXPECT_EQ(ranked[5].config.cluster_m * ranked[5].config.cluster_n, 4);
  bool idle_reason = false;
  for (const auto& r : ranked[5].reasons) idle_reason |= r.find("only 120 of 132 SMs") != std::string::npos;
  EXPECT_TRUE(idle_reason);
  EXPECT_EQ(sm90_cluster_sms(1), 132);
  EXPECT_EQ(sm90_cluster_sms(2), 132);
  EXPECT_EQ(sm90_cluster_sms(4), 120);
}

TEST(Candidates, TilesOfOneWaveShareTheirOperandPanels) {
  // A (8192x14336 bf16, 235 MB) and B (117 MB) exceed L2. The 132 data-parallel tiles of a wave
  // read each panel once, so A is not read once per column of tiles (16 times) but about once,
  // and the GEMM is compute-bound.
  const auto p = bf16_problem(8192, 4096, 14336);
  auto c = cfg(128, 256, 64);
  c.cluster_m = 2;
  auto has = [](const Ranked& r, const std::string& text) {
    for (const auto& why : r.reasons) {
      if (why.find(text) != std::string::npos) return true;
    }
    return false;
  };
  const auto persistent = rank_sm90(p, {c}).at(0);
  EXPECT_FALSE(has(persistent, "memory-bound"));
  EXPECT_TRUE(has(persistent, "re-read: A x1.09,"));
  // Stream-K: 1024 tiles leave a last wave of 100 of 132. CUTLASS's heuristic runs that
  // data-parallel (at least half full); the decomposition knob shares the last two waves' 232
  // tiles out over every SM, which the model finds faster than 8 waves of the stream-K kernel,
  // fixup included; but not faster than the persistent kernel, which lacks the stream-K
  // scheduler's own 2 %.
  c.tile_scheduler = "stream_k";
  const auto knob = rank_sm90(p, {c}).at(0);
  EXPECT_TRUE(has(knob, "stream_k (decomposition knob: stream_k): 51968 K iterations of 232 tiles over 132 SMs, "
                        "plus fixup, after 6 data-parallel waves"));
  EXPECT_GT(knob.score, persistent.score);
  EXPECT_LT(knob.score, persistent.score * 1.02);
  // 7936 x 4352: 1054 tiles, a last wave of 130. Forcing stream-K would save 2 idle SMs of a wave
  // and pay the fixup on two waves' tiles: data-parallel, reading as the persistent kernel does.
  const auto full = bf16_problem(7936, 4352, 14336);
  const auto whole = rank_sm90(full, {c}).at(0);
  EXPECT_TRUE(has(whole, "stream_k runs data-parallel here (1054 tiles: a last wave at least half full"));
  c.tile_scheduler = "persistent";
  const auto whole_dp = rank_sm90(full, {c}).at(0);
  c.tile_scheduler = "stream_k";
  // N = 4352: 1088 tiles, a last wave of 32. The last two waves' worth (164 tiles) go stream-K,
  // and those tiles read their own panels: A is read more often than by data-parallel waves.
  const auto q = bf16_problem(8192, 4352, 14336);
  const auto split = rank_sm90(q, {c}).at(0);
  EXPECT_TRUE(has(split, "K iterations of 164 tiles over 132 SMs, plus fixup, after 7 data-parallel waves"));
  c.tile_scheduler = "persistent";
  const auto dp = rank_sm90(q, {c}).at(0);
  auto a_reads = [](const Ranked& r) {
    for (const auto& why : r.reasons) {
      const auto at = why.find("re-read: A x");
      if (at != std::string::npos) return std::stod(why.substr(at + 12));
    }
    return 1.0;
  };
  EXPECT_GT(a_reads(split), a_reads(dp) + 1.0);
  EXPECT_DOUBLE_EQ(a_reads(whole), a_reads(whole_dp));
}

TEST(Candidates, StreamKIsNeverWorseThanItsDataParallelLaunch) {
  // The model takes the faster of CUTLASS's heuristic and the forced decomposition, memory
  // included (stream-K tiles re-read their operand panels), so a stream_k config scores at most
  // its persistent twin plus the stream-K scheduler's 2 %, whatever the problem.
  for (const auto& [m, n, k] : std::vector<std::array<int64_t, 3>>{
           {2048, 2048, 16384}, {4096, 4096, 4096}, {8192, 4096, 14336}, {4224, 512, 4096}, {1000, 3000, 512}}) {
    const auto p = bf16_problem(m, n, k);
    for (auto c : {cfg(128, 64, 64), cfg(128, 256, 64), cfg(256, 128, 64), cfg(128, 128, 64)}) {
      for (const auto& cl : {std::pair{1, 1}, std::pair{2, 1}, std::pair{1, 2}}) {
        c.cluster_m = cl.first;
        c.cluster_n = cl.second;
        c.tile_scheduler = "persistent";
        const double dp = rank_sm90(p, {c}).at(0).score;
        c.tile_scheduler = "stream_k";
        EXPECT_LE(rank_sm90(p, {c}).at(0).score, dp * 1.02 * (1 + 1e-9)) << m << "x" << n << "x" << k << " " << c.name();
      }
    }
  }
  // A tile of 8 K iterations or fewer never runs stream-K in CUTLASS (min_iters_per_sk_unit_).
  auto shortk = cfg(128, 256, 64);
  shortk.tile_scheduler = "stream_k";
  const auto r = rank_sm90(bf16_problem(4096, 4096, 512), {shortk}).at(0);
  EXPECT_TRUE(std::any_of(r.reasons.begin(), r.reasons.end(), [](const std::string& why) {
    return why.find("stream_k runs data-parallel here (512 tiles") != std::string::npos;
  }));
}

TEST(Candidates, EpilogueModelOrdersTheMeasuredPairsAsTheH200Did) {
  // Cooperative 128x256 against pingpong 128x128 (2x1 clusters both), each pair measured in one
  // run on the H200. Small K and a heavy output (f32, a residual read) favour pingpong, which
  // hides the epilogue; a long K favours the larger tile. Sources: data/registry_seed.json (the
  // GEMM runs) and bench/results/2026-12-01-tf32-pingpong/ (the MiniGPT block's TF32 GEMMs).
  struct Pair {
    const char* what;
    std::string dtype;
    int64_t batch, m, n, k;
    bool residual;
    double pingpong_us, cooperative_us;
  };
  const std::vector<Pair> pairs = {
      {"bf16 batched", "bf16", 128, 512, 2048, 1024, false, 382.8, 395.4},
      {"bf16 MLP up, bias+GELU", "bf16", 1, 65536, 3072, 768, false, 465.0, 503.3},
      {"bf16 square", "bf16", 1, 4096, 4096, 4096, false, 187.4, 178.9},
      {"TF32 MLP up, bias+GELU", "f32", 1, 65536, 3072, 768, false, 899.4, 949.8},
      {"TF32 attention out, bias+residual", "f32", 1, 65536, 768, 768, true, 244.2, 276.3},
      {"TF32 MLP down, bias+residual", "f32", 1, 65536, 768, 3072, true, 875.3, 822.7},
      {"TF32 QKV, bias", "f32", 1, 65536, 2304, 768, false, 601.0, 629.3},
  };
  for (const auto& pair : pairs) {
    auto mt = gemm_match(pair.m, pair.n, pair.k, pair.dtype);
    mt.problem["batch"] = pair.batch;
    auto p = GemmProblem::from_match(mt);
    p.reads_source = pair.residual;
    const int tk = pair.dtype == "f32" ? 32 : 64;
    auto coop = cfg(128, 256, tk), pp = cfg(128, 128, tk, "pingpong");
    for (auto* c : {&coop, &pp}) {
      c->cluster_m = 2;
      if (pair.dtype == "f32") c->math = "tf32";
    }
    const auto ranked = rank_sm90(p, {coop, pp});
    const auto& faster = pair.pingpong_us < pair.cooperative_us ? pp : coop;
    EXPECT_EQ(ranked.at(0).config, faster) << pair.what << ": measured pingpong " << pair.pingpong_us
                                          << " us, cooperative " << pair.cooperative_us << " us; model "
                                          << ranked[0].config.name() << " " << ranked[0].est_us << " us, "
                                          << ranked[1].config.name() << " " << ranked[1].est_us << " us\n"
                                          << json(ranked[0].reasons).dump() << "\n"
                                          << json(ranked[1].reasons).dump();
  }
}

TEST(Candidates, StreamKHelpsAnUnderfilledWave) {
  // 16 tiles of 128x128 and a long K: stream-K spreads the K iterations over all SMs.
  const auto p = bf16_problem(512, 512, 16384);
  const auto ranked = rank_sm90(p, {cfg(128, 128, 64), cfg(128, 128, 64, "cooperative", 0, "stream_k")});
  EXPECT_EQ(ranked[0].config.tile_scheduler, "stream_k");
}

TEST(Candidates, TopNBoundsTheOutput) {
  const auto m = gemm_match(4096, 3072, 768);
  CandidateOptions opt;
  opt.top_n = 3;
  const auto three = candidates(m, opt);
  EXPECT_EQ(three.ranked.size(), 3u);
  EXPECT_GT(three.kept, 3u);
  EXPECT_EQ(three.enumerated, three.kept + three.dropped.size());
  EXPECT_EQ(candidates(m).ranked.size(), 8u);  // the default
  opt.top_n = 100000;
  const auto all = candidates(m, opt);
  EXPECT_EQ(all.ranked.size(), all.kept);
  for (size_t i = 1; i < all.ranked.size(); ++i) EXPECT_LE(all.ranked[i - 1].score, all.ranked[i].score);
  // The cut keeps the best, and distinct kernels before cluster variants of one kernel or
  // stream_k twins of a persistent one (768 tiles of 128x128: a partial last wave, so listed).
  EXPECT_EQ(three.ranked[0].config, all.ranked[0].config);
  for (size_t i = 1; i < three.ranked.size(); ++i) EXPECT_LE(three.ranked[i - 1].score, three.ranked[i].score);
  EXPECT_TRUE(std::any_of(all.ranked.begin(), all.ranked.end(),
                          [](const Ranked& r) { return r.config.tile_scheduler == "stream_k"; }));
  std::set<std::string> kernels;
  for (const auto& r : candidates(m).ranked) {
    auto c = r.config;
    c.cluster_m = c.cluster_n = 1;
    c.tile_scheduler = "persistent";
    kernels.insert(c.name());
  }
  EXPECT_EQ(kernels.size(), 8u);
  // Nothing kept violates a rule the filter knows.
  for (const auto& r : all.ranked) EXPECT_EQ(verdict(all.problem, r.config), "") << r.config.name();
}

TEST(Candidates, NamedConfigsReplaceTheTopN) {
  const auto m = gemm_match(8448, 4096, 4096);  // 1056 tiles of 128x256: 8 whole waves
  CandidateOptions opt;
  opt.top_n = 1;  // ignored with names
  auto a = cfg(128, 256, 64), b = cfg(128, 128, 64, "pingpong");
  a.cluster_m = 2;
  b.cluster_n = 2;
  opt.only = {b.name(), a.name()};
  const auto c = candidates(m, opt);
  ASSERT_EQ(c.ranked.size(), 2u);
  std::set<std::string> got{c.ranked[0].config.name(), c.ranked[1].config.name()};
  EXPECT_EQ(got, (std::set<std::string>{a.name(), b.name()}));
  EXPECT_LE(c.ranked[0].score, c.ranked[1].score);  // best score first, whatever the order asked
  // A name of the right shape outside this pattern's space (a stream-K variant its size does not
  // list) is left out for this pattern; it may fit another.
  auto sk = a;
  sk.tile_scheduler = "stream_k";
  opt.only = {a.name(), sk.name()};
  const auto mixed = candidates(m, opt);
  ASSERT_EQ(mixed.ranked.size(), 1u);
  EXPECT_EQ(mixed.ranked[0].config, a);
  EXPECT_TRUE(GemmConfig::is_name(sk.name()));
  EXPECT_FALSE(GemmConfig::is_name("t128x128x64_c2x1_coop"));
  EXPECT_FALSE(GemmConfig::is_name(" " + a.name()));
  // Names the filter drops for this problem: the pattern is not supported, with the reasons.
  auto pp_wide = cfg(128, 256, 64, "pingpong");  // 256 accumulators per thread
  opt.only = {pp_wide.name()};
  try {
    candidates(m, opt);
    FAIL() << "a dropped config was kept";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find(pp_wide.name() + ": registers"), std::string::npos) << e.what();
  }
  opt.only = {sk.name()};
  try {
    candidates(m, opt);
    FAIL() << "a config outside the space was kept";
  } catch (const NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find(sk.name() + ": not in this pattern's configuration space"),
              std::string::npos)
        << e.what();
  }
}

TEST(Candidates, DroppedLogIsJson) {
  const auto c = candidates(gemm_match(4096, 3072, 768));
  const auto log = dropped_json(c);
  EXPECT_EQ(log["signature"], "gemm[bias]:bf16,bf16->bf16:row,col");
  EXPECT_EQ(log["dropped"].size(), c.dropped.size());
  ASSERT_FALSE(log["dropped"].empty());
  for (const auto& d : log["dropped"]) {
    EXPECT_TRUE(d["name"].is_string());
    EXPECT_FALSE(d["reason"].get<std::string>().empty());
    EXPECT_EQ(GemmConfig::from_json(d["config"]).name(), d["name"]);
  }
  const auto full = candidates_json(c);
  EXPECT_EQ(full["ranked"].size(), c.ranked.size());
  EXPECT_EQ(full["ranked"][0]["rank"], 1);
  // Round-trips through text (what the caller writes to the run directory).
  EXPECT_EQ(json::parse(full.dump()), full);
}

TEST(Candidates, RegistryMeasurementsBoostTheirConfig) {
  const test::ScratchDir dir("fact_cand");
  const auto m = gemm_match(4096, 3072, 768);
  CandidateOptions opt;
  opt.top_n = 1000;
  const auto before = candidates(m, opt);
  ASSERT_GT(before.ranked.size(), 10u);
  const auto target = before.ranked[10].config;  // a middling config
  {
    auto reg = registry::Registry::open_writable(dir.file("r.db"));
    reg.insert(tuned_row(before.signature, m.problem, target, 100));
    // A tuned config outside the lists (fixed stages) joins the candidates.
    // It measured twice as slow as the target, so it is not boosted.
    auto extra = cfg(128, 128, 64, "pingpong", 4);
    reg.insert(tuned_row(before.signature, m.problem, extra, 200));
    opt.registry = &reg;
    const auto after = candidates(m, opt);
    EXPECT_EQ(after.ranked[0].config, target);
    EXPECT_NE(after.ranked[0].reasons.back().find("registry"), std::string::npos);
    EXPECT_EQ(after.enumerated, before.enumerated + 1);
    bool has_extra = false;
    for (const auto& r : after.ranked) has_extra |= r.config == extra;
    EXPECT_TRUE(has_extra);
  }
}

TEST(Candidates, ALoneSlowMeasurementDoesNotOutrankWhatTheModelExpectsFaster) {
  // One config measured on the problem, far slower than the model expects of the others (in
  // measured units: the measurement calibrates the model): it is not "the best there".
  const test::ScratchDir dir("fact_cand_lone");
  const auto m = gemm_match(4096, 3072, 768);
  CandidateOptions opt;
  opt.top_n = 1000;
  const auto before = candidates(m, opt);
  const auto worst = before.ranked.back().config;
  auto reg = registry::Registry::open_writable(dir.file("r.db"));
  // the model was right about it
  reg.insert(tuned_row(before.signature, m.problem, worst, before.ranked.back().est_us));
  opt.registry = &reg;
  const auto after = candidates(m, opt);
  EXPECT_EQ(after.ranked.front().config, before.ranked.front().config);
  EXPECT_EQ(after.ranked.back().config, worst);
  EXPECT_NE(after.ranked.back().reasons.back().find("slower than the best there"), std::string::npos)
      << after.ranked.back().reasons.back();
}

TEST(Candidates, AConfigMeasuredFastestLeadsWhenTheModelsFavouriteMeasuredSlower) {
  // The MiniGPT attention-out GEMM in 3xTF32 (65536x768x768, bias + residual), every config
  // measured on the H200 (bench/results/2026-12-01-3xtf32/call2): the model favours 128x128
  // tiles, which measured 1152-1196 us; 64x128x32 measured 1093 us. A config measured there is
  // judged by its measurement, not its estimate: the configs rank in their measured order.
  const test::ScratchDir dir("fact_cand_measured_fastest");
  auto m = gemm_match(65536, 768, 768, "f32");
  m.operands.push_back({"residual", -1, "full"});
  CandidateOptions opt;
  opt.precision = "highest";
  opt.top_n = 1000;
  const auto cold = candidates(m, opt);
  ASSERT_EQ(cold.ranked.front().config.tile_m * cold.ranked.front().config.tile_n, 128 * 128);
  const std::map<std::string, double> measured = {
      {"t64x128x32_c1x1_ms_evt_s3_grid_3xtf32", 1093.4}, {"t128x64x16_c1x1_ms_evt_s4_grid_3xtf32", 1146.6},
      {"t128x64x32_c1x1_ms_evt_s3_grid_3xtf32", 1147.7}, {"t128x128x32_c1x1_ms_evt_s3_grid_3xtf32", 1152.5},
      {"t64x128x16_c1x1_ms_evt_s4_grid_3xtf32", 1162.8}, {"t64x256x32_c1x1_ms_evt_s3_grid_3xtf32", 1172.5},
      {"t64x256x16_c1x1_ms_evt_s3_grid_3xtf32", 1186.3}, {"t128x128x16_c1x1_ms_evt_s3_grid_3xtf32", 1187.2},
      {"t128x128x16_c1x1_ms_evt_s4_grid_3xtf32", 1195.8}, {"t64x64x32_c1x1_ms_evt_s3_grid_3xtf32", 1206.1},
      {"t256x64x32_c1x1_ms_evt_s3_grid_3xtf32", 1223.0},  {"t64x64x16_c1x1_ms_evt_s3_grid_3xtf32", 1248.9},
      {"t256x64x16_c1x1_ms_evt_s3_grid_3xtf32", 1254.3}};
  ASSERT_EQ(cold.ranked.size(), measured.size());
  auto reg = registry::Registry::open_writable(dir.file("r.db"));
  for (const auto& r : cold.ranked) {
    reg.insert(tuned_row(cold.signature, m.problem, r.config, measured.at(r.config.name())));
  }
  opt.registry = &reg;
  const auto warm = candidates(m, opt);
  // Those within 10% of the best lead in their measured order (the rest follow their estimates).
  for (size_t i = 1; i < warm.ranked.size() && measured.at(warm.ranked[i].config.name()) <= 1.1 * 1093.4; ++i) {
    EXPECT_LT(measured.at(warm.ranked[i - 1].config.name()), measured.at(warm.ranked[i].config.name())) << i;
  }
  EXPECT_EQ(warm.ranked.at(3).config.name(), "t128x128x32_c1x1_ms_evt_s3_grid_3xtf32");
  EXPECT_EQ(warm.ranked.front().config.name(), "t64x128x32_c1x1_ms_evt_s3_grid_3xtf32");
}

TEST(Candidates, StagesThatCannotCoverTheLoadLatencySlowTheMainloop) {
  // bf16 4096^3 on the H200 (data/registry_seed.json): 128x256x128 builds with 2 stages and ran
  // 249.0 us, 1.39x the 4-stage 128x256x64 (178.9 us). A TF32 128x256x32 tile builds with 3
  // stages next to a residual's buffers and ran at full speed (bench/results/2026-12-01-tf32-pingpong/).
  const auto p = bf16_problem(4096, 4096, 4096);
  auto two = cfg(128, 256, 128), four = cfg(128, 256, 64);
  two.cluster_m = four.cluster_m = 2;
  ASSERT_EQ(smem_sm90(p, two).stages, 2);
  ASSERT_GE(smem_sm90(p, four).stages, 4);
  const auto ranked = rank_sm90(p, {two, four});
  ASSERT_EQ(ranked[0].config, four);
  EXPECT_NEAR(ranked[1].est_us / ranked[0].est_us, 249.0 / 178.9, 0.1);
  bool said = false;
  for (const auto& r : ranked[1].reasons) said |= r.find("2 stages of") != std::string::npos;
  EXPECT_TRUE(said);
  auto mt = gemm_match(65536, 768, 3072, "f32");
  mt.operands.push_back({"residual", -1, "full"});
  const auto tf32 = GemmProblem::from_match(mt);
  auto coop = cfg(128, 256, 32);
  coop.cluster_m = 2;
  coop.math = "tf32";
  ASSERT_EQ(smem_sm90(tf32, coop).stages, 3);
  const auto alone = rank_sm90(tf32, {coop});
  for (const auto& r : alone.at(0).reasons) EXPECT_EQ(r.find("stages of"), std::string::npos) << r;
}

TEST(Candidates, ConfigsMeasuredOnTheProblemRankAsMeasured) {
  // The MiniGPT MLP down projection in TF32, as measured on the H200
  // (bench/results/2026-12-01-tf32-pingpong/): pingpong 128x128 with a 1x2 cluster led, though
  // the model prefers cooperative 128x256 and the 2x1 cluster. The top 4 lead with the measured order.
  const test::ScratchDir dir("fact_cand_measured");
  auto m = gemm_match(65536, 768, 3072, "f32");
  m.epilogue = {"bias", "residual"};
  m.operands.push_back({"residual", -1, "full"});
  ASSERT_TRUE(GemmProblem::from_match(m).reads_source);
  CandidateOptions opt;
  opt.top_n = 4;
  opt.precision = "high";
  auto reg = registry::Registry::open_writable(dir.file("r.db"));
  auto tf32 = [](GemmConfig c, int cm, int cn) {
    c.cluster_m = cm;
    c.cluster_n = cn;
    c.math = "tf32";
    return c;
  };
  const auto pp12 = tf32(cfg(128, 128, 32, "pingpong"), 1, 2), coop = tf32(cfg(128, 256, 32), 2, 1),
             pp21 = tf32(cfg(128, 128, 32, "pingpong"), 2, 1), slow = tf32(cfg(64, 256, 32, "pingpong"), 2, 1);
  const auto signature = candidates(m, opt).signature;
  for (const auto& [c, us] : std::vector<std::pair<GemmConfig, double>>{
           {pp12, 810.4}, {coop, 822.7}, {pp21, 875.3}, {slow, 948.1}}) {
    reg.insert(tuned_row(signature, m.problem, c, us));
  }
  opt.registry = &reg;
  const auto ranked = candidates(m, opt).ranked;
  ASSERT_EQ(ranked.size(), 4u);
  EXPECT_EQ(ranked[0].config, pp12) << ranked[0].config.name();
  EXPECT_EQ(ranked[1].config, coop) << ranked[1].config.name();
  // pp21 measured well too, but it is pp12's kernel with another cluster: the top N covers
  // distinct kernels first.
  for (size_t i = 2; i < ranked.size(); ++i) EXPECT_NE(ranked[i].config, pp21) << i;
  EXPECT_NE(ranked[0].reasons.back().find("810.4 us measured on the same problem"), std::string::npos)
      << ranked[0].reasons.back();
  // 948 us is more than 10% behind the best: not promoted, and not in the top 4.
  for (const auto& r : ranked) EXPECT_NE(r.config, slow);
}

}  // namespace
TEST(Candidates, PingpongWithStreamKIsDropped) {
  const auto p = bf16_problem(256, 256, 524288);
  GemmConfig c = cfg(128, 128, 64, "pingpong", 0, "stream_k");
  const auto r = filter_sm90(p, {c});
  ASSERT_EQ(r.dropped.size(), 1u);
  EXPECT_NE(r.dropped[0].reason.find("stream_k"), std::string::npos) << r.dropped[0].reason;
  // What the large-K problem gets instead: cooperative stream_k kernels survive.
  for (const auto& k : filter_sm90(p, enumerate_sm90(p)).kept) {
    EXPECT_FALSE(k.kernel_schedule == "pingpong" && k.tile_scheduler == "stream_k") << k.name();
  }
}

// A horizontal GEMM runs CUTLASS's grouped kernel: the lists give it the group scheduler only,
// the filter drops every other scheduler (and the sm80 3xTF32 kernels, which have no grouped
// form) with the reason, and the model tiles each part on its own.
TEST(Candidates, HorizontalGemmsTakeTheGroupSchedulerOnly) {
  auto mt = gemm_match(8192, 6144, 4096);
  mt.family = Family::horizontal_gemm;
  mt.problem["n_parts"] = {4096, 1024, 1024};
  const auto p = GemmProblem::from_match(mt);
  const auto listed = enumerate_sm90(p);
  ASSERT_FALSE(listed.empty());
  for (const auto& c : listed) {
    EXPECT_EQ(c.tile_scheduler, "group") << c.name();
    EXPECT_TRUE(GemmConfig::is_name(c.name())) << c.name();  // so --configs can name it
  }
  EXPECT_FALSE(filter_sm90(p, listed).kept.empty());
  EXPECT_NE(verdict(p, cfg(128, 256, 64)).find("grouped (ptr-array) kernel"), std::string::npos);
  EXPECT_NE(verdict(p, cfg(128, 256, 64, "cooperative", 0, "stream_k")).find("group"), std::string::npos);
  EXPECT_EQ(verdict(p, cfg(128, 256, 64, "cooperative", 0, "group")), "");
  // a plain GEMM refuses the group scheduler
  EXPECT_NE(verdict(bf16_problem(8192, 6144, 4096), cfg(128, 256, 64, "cooperative", 0, "group")).find("horizontal"),
            std::string::npos);
  // a grouped kernel takes at most 8 parts
  auto many = mt;
  many.problem["n_parts"] = std::vector<int64_t>(9, 512);
  many.problem["n"] = 9 * 512;
  EXPECT_NE(verdict(GemmProblem::from_match(many), cfg(128, 256, 64, "cooperative", 0, "group")).find("at most 8"),
            std::string::npos);
  // fp32-accurate: no grouped 3xTF32 kernel
  auto f32 = gemm_match(8192, 6144, 4096, "f32");
  f32.family = Family::horizontal_gemm;
  f32.problem["n_parts"] = {4096, 1024, 1024};
  const auto pf = GemmProblem::from_match(f32);
  const auto highest = filter_sm90(pf, enumerate_sm90(pf, "highest"));
  EXPECT_TRUE(highest.kept.empty());
  ASSERT_FALSE(highest.dropped.empty());
  EXPECT_NE(highest.dropped[0].reason.find("no grouped (horizontal) form"), std::string::npos);
  // Each part tiles on its own: three parts of 384 columns take 2 tiles of 256 each, 6 along N
  // where 1152 columns in one take 5; with 24 tiles along M that is 144 tiles (two waves on 132
  // SMs) against 120 (one).
  auto odd = mt;
  odd.problem["m"] = 3072;
  odd.problem["n"] = 1152;
  odd.problem["n_parts"] = {384, 384, 384};
  auto whole = gemm_match(3072, 1152, 4096);
  const auto ranked_odd = rank_sm90(GemmProblem::from_match(odd), {cfg(128, 256, 64, "cooperative", 0, "group")});
  const auto ranked_whole = rank_sm90(GemmProblem::from_match(whole), {cfg(128, 256, 64)});
  EXPECT_GT(ranked_odd.at(0).est_us, ranked_whole.at(0).est_us);
}

TEST(Candidates, LongKWithFewTilesPrefersReadingEachOperandOnce) {
  // 256 x 256 x 524288 bf16: A and B are 256 MB each, far beyond L2. 128x64 tiles would read A
  // four times; 128x256 tiles in a 2x1 cluster read each operand once.
  const auto p = bf16_problem(256, 256, 524288);
  const auto ranked = rank_sm90(p, {cfg(128, 64, 64, "cooperative", 0, "stream_k"),
                                    cfg(128, 256, 64, "cooperative", 0, "stream_k")});
  EXPECT_EQ(ranked[0].config.tile_n, 256) << ranked[0].config.name();
}

TEST(Candidates, RegistryConfigsOfAnotherMathAreNotCandidates) {
  const test::ScratchDir dir("fact_cand_math");
  const auto m = gemm_match(4096, 3072, 768, "f32");
  CandidateOptions high;
  high.top_n = 1000;
  high.precision = "high";
  const auto tf32 = candidates(m, high);
  ASSERT_FALSE(tf32.ranked.empty());
  auto measured = tf32.ranked[0].config;
  measured.stages = 5;  // outside the literal lists: it can only come from the registry
  ASSERT_EQ(measured.math, "tf32");
  {
    auto reg = registry::Registry::open_writable(dir.file("r.db"));
    reg.insert(tuned_row(tf32.signature, m.problem, measured, 100));
    CandidateOptions highest = high;
    highest.precision = "highest";  // fp32-accurate: 3xtf32 math only
    const auto cold = candidates(m, highest);
    high.registry = &reg;
    highest.registry = &reg;
    EXPECT_EQ(candidates(m, high).enumerated, tf32.enumerated + 1);  // the measured config joins
    const auto accurate = candidates(m, highest);
    EXPECT_EQ(accurate.enumerated, cold.enumerated);  // ... but not under another math
    for (const auto& r : accurate.ranked) EXPECT_EQ(r.config.math, "3xtf32");
  }
}

}  // namespace fact::realize

namespace fact::realize {
namespace {

// sm80 multistage (3xTF32) configs: what the filter drops, and why.
TEST(Candidates, MultistageFilterDropsWhatCutlassCannotBuild) {
  const auto p = GemmProblem::from_match(gemm_match(4096, 4096, 4096, "f32"));
  const GemmConfig good = enumerate_multistage().at(0);  // 128x128x16, 4 stages
  auto with = [&](auto change) {
    GemmConfig c = good;
    change(c);
    return verdict(p, c);
  };
  EXPECT_EQ(verdict(p, good), "");
  EXPECT_NE(with([](GemmConfig& c) { c.cluster_m = 2; }).find("no cluster"), std::string::npos);
  EXPECT_NE(with([](GemmConfig& c) { c.tile_k = 64; }).find("tile_k 64 is not 16 or 32"), std::string::npos);
  EXPECT_NE(with([](GemmConfig& c) { c.stages = 2; }).find("needs 3"), std::string::npos);
  EXPECT_NE(with([](GemmConfig& c) { c.math = "tf32"; }).find("3xTF32 only"), std::string::npos);
  // 256x128 on 8 warps: 128 accumulators a thread, beyond what 3xTF32's fragments leave room for.
  EXPECT_NE(with([](GemmConfig& c) { c.tile_m = 256; }).find("registers: a 256x128x16 tile on 8 warps is 128"),
            std::string::npos);
  // 128x128x32 in 8 stages: 256 KB of shared memory.
  EXPECT_NE(with([](GemmConfig& c) {
              c.tile_k = 32;
              c.stages = 8;
            }).find("shared memory: 128x128x32 needs 256 KB"),
            std::string::npos);
  const auto bf16 = bf16_problem(4096, 4096, 4096);
  EXPECT_NE(verdict(bf16, good).find("f32 operands in 3xTF32 only"), std::string::npos);
  // TF32 WGMMA kernels read K-major operands only (wrong results otherwise); 3xTF32 any layout.
  auto rr = gemm_match(4096, 4096, 4096, "f32");
  rr.attrs["layout_b"] = "row";
  const auto row_row = GemmProblem::from_match(rr);
  auto tf32 = cfg(128, 128, 32);
  tf32.math = "tf32";
  EXPECT_NE(verdict(row_row, tf32).find("TF32 WGMMA kernels need K-major operands (row A, col B), got row A, row B"),
            std::string::npos)
      << verdict(row_row, tf32);
  EXPECT_EQ(verdict(row_row, good), "");
}

// Under "highest" every candidate of an f32 GEMM is a 3xTF32 kernel, ranked by the sm80 model:
// a large problem takes a big tile, a small one a small tile that fills more SMs.
TEST(Candidates, HighestRanksTheMultistageKernels) {
  CandidateOptions opt;
  opt.precision = "highest";
  opt.top_n = 3;
  const auto big = candidates(gemm_match(8192, 8192, 4096, "f32"), opt);
  ASSERT_EQ(big.ranked.size(), 3u);
  for (const auto& r : big.ranked) EXPECT_EQ(r.config.math, "3xtf32");
  EXPECT_EQ(big.ranked.at(0).config.tile_m * big.ranked.at(0).config.tile_n, 128 * 128)
      << big.ranked.at(0).config.name();
  EXPECT_NE(big.ranked.at(0).reasons.at(0).find("sm80 multistage"), std::string::npos);
  const auto small = candidates(gemm_match(256, 512, 1024, "f32"), opt);
  EXPECT_EQ(small.ranked.at(0).config.tile_m * small.ranked.at(0).config.tile_n, 64 * 64)
      << small.ranked.at(0).config.name();
  // (Registry rows of TF32 kernels stay out: RegistryConfigsOfAnotherMathAreNotCandidates.)
}

}  // namespace
}  // namespace fact::realize
