// The pattern registry: schema, retrieval order, refusal of other versions, and survival of an
// interrupted write.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "discover/planner.h"
#include "graph_builder.h"
#include "ir/error.h"
#include "registry/registry.h"
#include "sample_graphs.h"

namespace fact::test {
namespace {

namespace fs = std::filesystem;
using registry::Registry;
using registry::Row;

class RegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "fact_registry_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = (fs::path(dir_) / "sub" / "registry.db").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  static Row row(const json& problem, double time_us, const std::string& arch = "sm90",
                 const std::string& disposition = "passed", const std::string& sig = kSig) {
    Row r;
    r.signature = sig;
    r.arch = arch;
    r.problem = problem;
    r.config = {{"tile", json::array({128, 128, 64})}, {"time", time_us}};
    r.time_us = time_us;
    r.disposition = disposition;
    r.provenance = "tuned";
    return r;
  }
  static json gemm_problem(int64_t m, int64_t n, int64_t k) { return {{"batch", 1}, {"m", m}, {"n", n}, {"k", k}}; }

  // Run SQL on the file directly; returns the first column of the first row ("" if none).
  std::string sql(const std::string& query) const {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    std::string out;
    sqlite3_stmt* st = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, query.c_str(), -1, &st, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    const int rc = sqlite3_step(st);
    EXPECT_TRUE(rc == SQLITE_ROW || rc == SQLITE_DONE) << sqlite3_errmsg(db);
    if (rc == SQLITE_ROW && sqlite3_column_text(st, 0)) out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    sqlite3_close(db);
    return out;
  }

  static constexpr const char* kSig = "gemm[bias+relu]:bf16,bf16->bf16:row,col";
  std::string dir_;
  std::string path_;
};

TEST_F(RegistryTest, OpenWritableCreatesTheFileAndSchema) {
  {
    auto reg = Registry::open_writable(path_);  // creates the missing parent folder too
    EXPECT_EQ(reg.count(), 0);
    EXPECT_EQ(reg.path(), path_);
  }
  ASSERT_TRUE(fs::exists(path_));
  EXPECT_EQ(sql("SELECT value FROM meta WHERE key = 'schema_version'"), std::to_string(registry::kSchemaVersion));
  EXPECT_EQ(sql("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'results'"), "results");
  EXPECT_EQ(sql("PRAGMA journal_mode"), "wal");
}

TEST_F(RegistryTest, ReopeningKeepsRowsAndSchema) {
  {
    auto reg = Registry::open_writable(path_);
    reg.insert(row(gemm_problem(128, 128, 128), 10));
  }
  auto reg = Registry::open_writable(path_);
  EXPECT_EQ(reg.count(), 1);
  EXPECT_EQ(sql("SELECT COUNT(*) FROM meta"), "1");
}

TEST_F(RegistryTest, InsertStoresEveryField) {
  {
    auto reg = Registry::open_writable(path_);
    auto r = row(gemm_problem(128, 256, 64), 12.5);
    r.error = 1e-3;
    reg.insert(r);
  }
  auto reg = Registry::open_readonly(path_);
  ASSERT_TRUE(reg.has_value());
  const auto hits = reg->lookup(kSig, "sm90", gemm_problem(128, 256, 64));
  ASSERT_EQ(hits.size(), 1u);
  const auto& h = hits[0];
  EXPECT_EQ(h.match, "exact");
  EXPECT_EQ(h.distance, 0.0);
  EXPECT_EQ(h.row.signature, kSig);
  EXPECT_EQ(h.row.arch, "sm90");
  EXPECT_EQ(h.row.problem, gemm_problem(128, 256, 64));
  EXPECT_EQ(h.row.config.at("tile"), json::array({128, 128, 64}));
  EXPECT_DOUBLE_EQ(h.row.time_us, 12.5);
  EXPECT_DOUBLE_EQ(h.row.error, 1e-3);
  EXPECT_EQ(h.row.disposition, "passed");
  EXPECT_EQ(h.row.provenance, "tuned");
}

TEST_F(RegistryTest, LookupIsExactFirstThenNearestBySize) {
  auto reg = Registry::open_writable(path_);
  reg.insert(row(gemm_problem(4096, 4096, 4096), 1));
  reg.insert(row(gemm_problem(256, 128, 128), 2));
  reg.insert(row(gemm_problem(128, 128, 128), 30));  // exact, though slowest
  reg.insert(row(gemm_problem(1024, 128, 128), 3));
  const auto hits = reg.lookup(kSig, "sm90", gemm_problem(128, 128, 128), 10);
  ASSERT_EQ(hits.size(), 4u);
  EXPECT_EQ(hits[0].match, "exact");
  EXPECT_EQ(hits[0].row.problem.at("m"), 128);
  EXPECT_EQ(hits[1].match, "nearest");
  EXPECT_EQ(hits[1].row.problem.at("m"), 256);
  EXPECT_DOUBLE_EQ(hits[1].distance, 1.0);  // one doubling of m
  EXPECT_EQ(hits[2].row.problem.at("m"), 1024);
  EXPECT_DOUBLE_EQ(hits[2].distance, 3.0);
  EXPECT_EQ(hits[3].row.problem.at("m"), 4096);
  EXPECT_DOUBLE_EQ(hits[3].distance, 5.0 + 5.0 + 5.0);
}

TEST_F(RegistryTest, ProblemsThatDifferBeyondTheirSizesAreNotExact) {
  // Horizontal GEMMs of equal m, n, k split n differently: another problem, one step away.
  auto reg = Registry::open_writable(path_);
  auto parts = [](json p, json n_parts) {
    p["n_parts"] = std::move(n_parts);
    return p;
  };
  const auto thirds = parts(gemm_problem(128, 2304, 768), {768, 768, 768});
  reg.insert(row(parts(gemm_problem(128, 2304, 768), {1536, 768}), 1));
  reg.insert(row(thirds, 2));
  auto no_parts = gemm_problem(128, 2304, 768);
  reg.insert(row(no_parts, 3));
  const auto hits = reg.lookup(kSig, "sm90", thirds, 10);
  ASSERT_EQ(hits.size(), 3u);
  EXPECT_EQ(hits[0].match, "exact");
  EXPECT_DOUBLE_EQ(hits[0].row.time_us, 2);
  EXPECT_EQ(hits[1].match, "nearest");
  EXPECT_DOUBLE_EQ(hits[1].distance, 1.0);
  EXPECT_EQ(hits[2].match, "nearest");
  EXPECT_DOUBLE_EQ(hits[2].distance, 1.0);
}

TEST_F(RegistryTest, EqualDistanceIsBrokenByTime) {
  auto reg = Registry::open_writable(path_);
  reg.insert(row(gemm_problem(256, 128, 128), 9));
  reg.insert(row(gemm_problem(128, 256, 128), 4));
  const auto hits = reg.lookup(kSig, "sm90", gemm_problem(128, 128, 128));
  ASSERT_EQ(hits.size(), 2u);
  EXPECT_DOUBLE_EQ(hits[0].row.time_us, 4);
  EXPECT_DOUBLE_EQ(hits[1].row.time_us, 9);
}

TEST_F(RegistryTest, LookupReturnsOnlyPassedRows) {
  auto reg = Registry::open_writable(path_);
  for (const char* d : {"incorrect", "fault", "compile_error", "not_supported"}) {
    reg.insert(row(gemm_problem(128, 128, 128), 1, "sm90", d));
  }
  EXPECT_TRUE(reg.lookup(kSig, "sm90", gemm_problem(128, 128, 128)).empty());
  reg.insert(row(gemm_problem(256, 128, 128), 50));
  const auto hits = reg.lookup(kSig, "sm90", gemm_problem(128, 128, 128));
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_EQ(hits[0].row.disposition, "passed");
  EXPECT_EQ(hits[0].match, "nearest");
  EXPECT_EQ(reg.count(), 5);
}

TEST_F(RegistryTest, LookupExcludesOtherArchAndSignature) {
  auto reg = Registry::open_writable(path_);
  reg.insert(row(gemm_problem(128, 128, 128), 1, "sm80"));
  reg.insert(row(gemm_problem(128, 128, 128), 1, "sm90", "passed", "gemm[bias]:bf16,bf16->bf16:row,col"));
  EXPECT_TRUE(reg.lookup(kSig, "sm90", gemm_problem(128, 128, 128)).empty());
  EXPECT_EQ(reg.lookup(kSig, "sm80", gemm_problem(128, 128, 128)).size(), 1u);
}

TEST_F(RegistryTest, LookupSkipsRowsSharingNoSize) {
  auto reg = Registry::open_writable(path_);
  reg.insert(row({{"rows", 32}, {"cols", 64}}, 1));
  EXPECT_TRUE(reg.lookup(kSig, "sm90", gemm_problem(128, 128, 128)).empty());
}

TEST_F(RegistryTest, LookupRespectsTheLimit) {
  auto reg = Registry::open_writable(path_);
  for (int i = 0; i < 6; ++i) reg.insert(row(gemm_problem(128 << i, 128, 128), 1));
  EXPECT_EQ(reg.lookup(kSig, "sm90", gemm_problem(128, 128, 128)).size(), 3u);  // the default
  const auto two = reg.lookup(kSig, "sm90", gemm_problem(128, 128, 128), 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].row.problem.at("m"), 128);
  EXPECT_EQ(two[1].row.problem.at("m"), 256);
  EXPECT_TRUE(reg.lookup(kSig, "sm90", gemm_problem(128, 128, 128), 0).empty());
}

TEST_F(RegistryTest, OpenReadonlyOfAMissingFileIsNullopt) {
  EXPECT_FALSE(Registry::open_readonly(path_).has_value());
  EXPECT_FALSE(fs::exists(path_));  // and it did not create it
}

TEST_F(RegistryTest, OpenReadonlySeesRowsButCannotWrite) {
  { Registry::open_writable(path_).insert(row(gemm_problem(128, 128, 128), 1)); }
  auto reg = Registry::open_readonly(path_);
  ASSERT_TRUE(reg.has_value());
  EXPECT_EQ(reg->count(), 1);
  EXPECT_THROW(reg->insert(row(gemm_problem(64, 64, 64), 1)), UserError);
  EXPECT_EQ(reg->count(), 1);
}

TEST_F(RegistryTest, KnobsRoundTripThroughRowsLookupAndExport) {
  auto reg = Registry::open_writable(path_);
  auto r = row(gemm_problem(64, 64, 64), 5);
  r.knobs = {{"raster", "along_n"}, {"max_swizzle", 4}, {"splits", 2}};
  reg.insert(r);
  EXPECT_EQ(reg.list().at(0).row.knobs, r.knobs);
  EXPECT_EQ(reg.lookup(kSig, "sm90", gemm_problem(64, 64, 64), 4).at(0).row.knobs, r.knobs);
  const auto doc = reg.export_json();
  EXPECT_EQ(doc["rows"][0]["knobs"], r.knobs);
  auto other = Registry::open_writable((fs::path(dir_) / "other.db").string());
  other.import_json(doc);
  EXPECT_EQ(other.list().at(0).row.knobs, r.knobs);
}

TEST_F(RegistryTest, SchemaOneFilesAreReadAndMigrated) {
  {  // a registry as FACT's schema 1 wrote it, with one row
    auto reg = Registry::open_writable(path_);
    reg.insert(row(gemm_problem(64, 64, 64), 5));
  }
  sql("ALTER TABLE results DROP COLUMN knobs");
  sql("UPDATE meta SET value = '1' WHERE key = 'schema_version'");
  {
    auto ro = Registry::open_readonly(path_);  // read-only: read as it is, knobs unknown
    ASSERT_TRUE(ro.has_value());
    EXPECT_EQ(ro->list().at(0).row.knobs, json::object());
    EXPECT_EQ(ro->lookup(kSig, "sm90", gemm_problem(64, 64, 64), 4).size(), 1u);
    EXPECT_EQ(ro->export_json()["rows"][0]["knobs"], json::object());
  }
  EXPECT_EQ(sql("SELECT value FROM meta WHERE key = 'schema_version'"), "1");
  {
    auto rw = Registry::open_writable(path_);  // writable: migrated to schema 2 in place
    EXPECT_EQ(rw.count(), 1);
    auto r = row(gemm_problem(128, 64, 64), 6);
    r.knobs = {{"splits", 4}};
    rw.insert(r);
  }
  EXPECT_EQ(sql("SELECT value FROM meta WHERE key = 'schema_version'"), "2");
  EXPECT_EQ(sql("SELECT knobs FROM results WHERE time_us = 5"), "{}");
  EXPECT_EQ(sql("SELECT knobs FROM results WHERE time_us = 6"), "{\"splits\":4}");
}

TEST_F(RegistryTest, AnotherSchemaVersionIsRefusedByName) {
  { Registry::open_writable(path_); }
  sql("UPDATE meta SET value = '7' WHERE key = 'schema_version'");
  ASSERT_EQ(sql("SELECT value FROM meta WHERE key = 'schema_version'"), "7");
  for (bool writable : {false, true}) {
    SCOPED_TRACE(writable ? "open_writable" : "open_readonly");
    try {
      if (writable) {
        Registry::open_writable(path_);
      } else {
        Registry::open_readonly(path_);
      }
      FAIL() << "no error";
    } catch (const UserError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("schema version 7 is not supported"), std::string::npos) << msg;
      EXPECT_NE(msg.find(path_), std::string::npos) << msg;
    }
  }
}

TEST_F(RegistryTest, AFileThatIsNotARegistryIsAUserError) {
  fs::create_directories(fs::path(path_).parent_path());
  sql("CREATE TABLE other(x INTEGER)");
  EXPECT_THROW(Registry::open_readonly(path_), UserError);
}

TEST_F(RegistryTest, InterruptedWriteLeavesTheFileUsable) {
  {
    auto reg = Registry::open_writable(path_);
    reg.insert(row(gemm_problem(128, 128, 128), 1));
    reg.insert(row(gemm_problem(256, 128, 128), 1));
  }
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child begins a large write and dies before committing it. With a tiny page cache,
    // SQLite spills the uncommitted pages into the WAL file, as a real crash mid-insert would.
    sqlite3* db = nullptr;
    if (sqlite3_open(path_.c_str(), &db) != SQLITE_OK) ::_exit(3);
    const char* q =
        "PRAGMA cache_size = 2;"
        "BEGIN IMMEDIATE;"
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)"
        " INSERT INTO results(signature, arch, problem, config, time_us, error, disposition, provenance)"
        " SELECT 'gemm[]:f32,f32->f32:row,row', 'sm90', '{\"m\":' || i || '}', '\"' || hex(randomblob(256)) || '\"',"
        " 1, 0, 'passed', 'tuned' FROM n;";
    if (sqlite3_exec(db, q, nullptr, nullptr, nullptr) != SQLITE_OK) ::_exit(4);
    ::_exit(0);  // no COMMIT, no close
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "the child could not begin its write";
  ASSERT_TRUE(fs::exists(path_ + "-wal"));
  EXPECT_GT(fs::file_size(path_ + "-wal"), 100u * 1024) << "the uncommitted write never reached the file";

  auto reg = Registry::open_writable(path_);
  EXPECT_EQ(reg.count(), 2);  // the uncommitted rows are gone
  reg.insert(row(gemm_problem(512, 128, 128), 1));
  EXPECT_EQ(reg.count(), 3);
  EXPECT_EQ(reg.lookup(kSig, "sm90", gemm_problem(512, 128, 128))[0].match, "exact");
  EXPECT_EQ(sql("PRAGMA integrity_check"), "ok");
}

TEST_F(RegistryTest, DefaultPathFollowsTheEnvironment) {
  const char* old_reg = std::getenv("FACT_REGISTRY");
  const char* old_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved_reg = old_reg ? old_reg : "", saved_xdg = old_xdg ? old_xdg : "";
  ::setenv("FACT_REGISTRY", "/tmp/x/reg.db", 1);
  EXPECT_EQ(Registry::default_path(), "/tmp/x/reg.db");
  ::unsetenv("FACT_REGISTRY");
  ::setenv("XDG_CACHE_HOME", "/tmp/cache", 1);
  EXPECT_EQ(Registry::default_path(), "/tmp/cache/fact/registry.db");
  old_reg ? ::setenv("FACT_REGISTRY", saved_reg.c_str(), 1) : ::unsetenv("FACT_REGISTRY");
  old_xdg ? ::setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1) : ::unsetenv("XDG_CACHE_HOME");
}

// ---------------------------------------------------------------------------------------------
// Signatures

TEST(Signature, GemmFromADiscoveredPattern) {
  GraphBuilder b("bf16");
  b.input("x", T("bf16", {64, 32}));
  b.param("w", T("bf16", {48, 32}));
  b.param("bias", T("bf16", {48}));
  b.call("lin", "aten.linear.default", {N("x"), N("w"), N("bias")}, T("bf16", {64, 48}));
  b.call("g", "aten.gelu.default", {N("lin")}, T("bf16", {64, 48}), {{"approximate", "tanh"}});
  const auto p = plan(b);
  ASSERT_EQ(p.d.chosen.size(), 1u);
  EXPECT_EQ(registry::signature(p.d.chosen[0].match), "gemm[bias+gelu_tanh]:bf16,bf16->bf16:row,col");
}

TEST(Signature, GemmWithoutEpilogueAndRowMajorB) {
  GraphBuilder b;
  b.input("a", T("f32", {6, 32, 64}));
  b.input("bm", T("f32", {6, 64, 40}));
  b.call("bmm", "aten.bmm.default", {N("a"), N("bm")}, T("f32", {6, 32, 40}));
  const auto p = plan(b);
  ASSERT_EQ(p.d.chosen.size(), 1u);
  EXPECT_EQ(registry::signature(p.d.chosen[0].match), "gemm[]:f32,f32->f32:row,row");
}

TEST(Signature, GatedMlpAndAttention) {
  const auto gated = plan(gated_mlp_graph("bf16"));
  ASSERT_EQ(gated.d.chosen.size(), 1u);
  EXPECT_EQ(registry::signature(gated.d.chosen[0].match), "gated_mlp[silu+mul]:bf16,bf16->bf16:row,col");
  const auto attn = plan(attention_graph("tril", -1, "bf16"));
  ASSERT_EQ(attn.d.chosen.size(), 1u);
  EXPECT_EQ(registry::signature(attn.d.chosen[0].match), "attention[scale+causal_mask+softmax]:bf16:causal");
  // V with its keys contiguous (fact.layouts' V^T projection) is timed apart; V with its head
  // dim contiguous is not, nor one whose keys and head dim both have stride 1
  auto m = attn.d.chosen[0].match;
  m.attrs["v_strides"] = {512, 6291456, 1, 65536};
  EXPECT_EQ(registry::signature(m), "attention[scale+causal_mask+softmax]:bf16:causal:v_keys");
  m.attrs["v_strides"] = {1179648, 96, 2304, 1};
  EXPECT_EQ(registry::signature(m), "attention[scale+causal_mask+softmax]:bf16:causal");
  m.attrs["v_strides"] = {96, 96, 1, 1};
  EXPECT_EQ(registry::signature(m), "attention[scale+causal_mask+softmax]:bf16:causal");
}

TEST(Signature, Norm) {
  discover::Match m;
  m.family = discover::Family::norm;
  m.epilogue = {"weight", "bias"};
  m.attrs = {{"kind", "layer_norm"}, {"dtype_in", "bf16"}, {"dtype_out", "f32"}, {"eps", 1e-5}};
  EXPECT_EQ(registry::signature(m), "norm[weight+bias]:bf16->f32:layer_norm");
}

}  // namespace
}  // namespace fact::test
