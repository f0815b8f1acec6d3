// Registry writes and `fact-engine registry`: list, show, export/import round trips, all-or-nothing
// imports of malformed files, idempotent duplicate imports, and the checked-in seed file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/registry_cmd.h"
#include "ir/error.h"
#include "registry/registry.h"

#if __has_include(<CLI/CLI.hpp>)
#include <CLI/CLI.hpp>
#define FACT_HAVE_CLI11 1
#endif

namespace fact {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using registry::Registry;
using registry::Row;

class RegistryCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("fact_regcli_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  void write(const std::string& name, const std::string& text) const {
    std::ofstream f(path(name));
    f << text;
  }

  static Row row(const std::string& sig, int64_t m, double time_us, const std::string& config_name,
                 const std::string& disposition = "passed") {
    Row r;
    r.signature = sig;
    r.arch = "sm90";
    r.problem = {{"batch", 1}, {"m", m}, {"n", 3072}, {"k", 768}};
    r.config = {{"name", config_name}, {"tile", {128, 128, 64}}};
    r.time_us = time_us;
    r.error = 1e-3;
    r.disposition = disposition;
    r.provenance = "tuned";
    return r;
  }

  // Three rows, one of them a compile error with no time.
  void fill(Registry& reg) const {
    reg.insert(row("gemm[bias+gelu_tanh]:bf16,bf16->bf16:row,col", 4096, 120.5, "a"));
    reg.insert(row("gemm[bias+gelu_tanh]:bf16,bf16->bf16:row,col", 8192, 230.0, "b"));
    reg.insert(row("gated_mlp[silu+mul]:bf16,bf16->bf16:row,col", 4096, 0, "c", "compile_error"));
  }

  int run(const std::string& action, const std::string& registry_path, std::string* out = nullptr,
          const std::string& file = "", const std::string& output = "", int64_t id = 0) const {
    cli::RegistryCommand cmd;
    cmd.action = action;
    cmd.registry_path = registry_path;
    cmd.file = file;
    cmd.output = output;
    cmd.id = id;
    std::ostringstream s;
    const int rc = cli::run_registry_command(cmd, s);
    if (out) *out = s.str();
    return rc;
  }

  // Every stored field but the id, which is local to a file.
  static std::vector<json> contents(const Registry& reg) {
    std::vector<json> v;
    for (const auto& e : reg.list()) {
      auto j = e.to_json();
      j.erase("id");
      v.push_back(j);
    }
    return v;
  }

  static std::string error_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
};

TEST_F(RegistryCli, ListFiltersAndGet) {
  auto reg = Registry::open_writable(path("r.db"));
  fill(reg);
  EXPECT_EQ(reg.list().size(), 3u);
  auto filter = [](const char* field, const std::string& value) {
    registry::ListFilter f;
    if (std::string(field) == "signature") f.signature = value;
    if (std::string(field) == "disposition") f.disposition = value;
    if (std::string(field) == "arch") f.arch = value;
    if (std::string(field) == "limit") f.limit = std::stoul(value);
    return f;
  };
  EXPECT_EQ(reg.list(filter("signature", "gemm[bias")).size(), 2u);
  EXPECT_EQ(reg.list(filter("disposition", "compile_error")).size(), 1u);
  EXPECT_EQ(reg.list(filter("arch", "sm80")).size(), 0u);
  EXPECT_EQ(reg.list(filter("limit", "2")).size(), 2u);
  const auto all = reg.list();
  EXPECT_LT(all[0].id, all[1].id);
  EXPECT_FALSE(all[0].created.empty());
  const auto e = reg.get(all[1].id);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->row.problem["m"], 8192);
  EXPECT_EQ(e->row.config["name"], "b");
  EXPECT_FALSE(reg.get(999));
  // lookup (what discovery reads) still sees passed rows only.
  EXPECT_EQ(reg.lookup("gated_mlp[silu+mul]:bf16,bf16->bf16:row,col", "sm90", json::object()).size(), 0u);
}

TEST_F(RegistryCli, ListAndShowCommands) {
  {
    auto reg = Registry::open_writable(path("r.db"));
    fill(reg);
  }
  std::string out;
  EXPECT_EQ(run("list", path("r.db"), &out), 0);
  EXPECT_NE(out.find("signature"), std::string::npos) << out;
  EXPECT_NE(out.find("m=8192 n=3072 k=768"), std::string::npos) << out;
  EXPECT_NE(out.find("compile_error"), std::string::npos) << out;
  EXPECT_NE(out.find("3 of 3 rows"), std::string::npos) << out;
  EXPECT_EQ(run("show", path("r.db"), &out, "", "", 2), 0);
  const auto j = json::parse(out);
  EXPECT_EQ(j["id"], 2);
  EXPECT_EQ(j["time_us"], 230.0);
  const auto missing_id = error_of([&] { run("show", path("r.db"), nullptr, "", "", 42); });
  EXPECT_NE(missing_id.find("no row with id 42"), std::string::npos) << missing_id;
  // A registry that does not exist is named, not shown as empty.
  const auto missing = error_of([&] { run("list", path("nope.db")); });
  EXPECT_NE(missing.find(path("nope.db")), std::string::npos) << missing;
  EXPECT_FALSE(fs::exists(path("nope.db")));
}

TEST_F(RegistryCli, ExportImportRoundTrip) {
  auto src = Registry::open_writable(path("src.db"));
  fill(src);
  // Through the library.
  const auto doc = src.export_json({{"host", "test"}});
  EXPECT_EQ(doc["fact_registry_export"], registry::kExportFormatVersion);
  EXPECT_EQ(doc["schema_version"], registry::kSchemaVersion);
  EXPECT_EQ(doc["produced_by"]["host"], "test");
  ASSERT_EQ(doc["rows"].size(), 3u);
  auto direct = Registry::open_writable(path("direct.db"));
  const auto stats = direct.import_json(doc);
  EXPECT_EQ(stats.rows, 3u);
  EXPECT_EQ(stats.inserted, 3u);
  EXPECT_EQ(stats.skipped, 0u);
  EXPECT_EQ(contents(direct), contents(src));  // created timestamps travel too
  // Through the command: export to a file, import into a fresh registry.
  std::string out;
  EXPECT_EQ(run("export", path("src.db"), &out, "", path("export.json")), 0);
  EXPECT_NE(out.find("3 rows exported"), std::string::npos) << out;
  EXPECT_EQ(json::parse(std::ifstream(path("export.json")))["rows"], doc["rows"]);
  EXPECT_EQ(run("import", path("fresh.db"), &out, path("export.json")), 0);
  EXPECT_NE(out.find("3 imported"), std::string::npos) << out;
  const auto fresh = Registry::open_readonly(path("fresh.db"));
  ASSERT_TRUE(fresh);
  EXPECT_EQ(contents(*fresh), contents(src));
  // Export to stdout is the same document.
  EXPECT_EQ(run("export", path("fresh.db"), &out), 0);
  EXPECT_EQ(json::parse(out)["rows"].size(), 3u);
}

TEST_F(RegistryCli, MalformedImportFailsAndChangesNothing) {
  auto reg = Registry::open_writable(path("r.db"));
  reg.insert(row("gemm[]:bf16,bf16->bf16:row,col", 1024, 10, "x"));
  auto good = Registry::open_writable(path("good.db"));
  fill(good);
  auto doc = good.export_json();
  // Not JSON at all: the error names the file.
  write("broken.json", "{\"fact_registry_export\": 1, \"rows\": [");
  auto e = error_of([&] { run("import", path("r.db"), nullptr, path("broken.json")); });
  EXPECT_NE(e.find(path("broken.json")), std::string::npos) << e;
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  // Two good rows then a bad one: nothing of the file is written.
  doc["rows"][2].erase("config");
  write("bad_row.json", doc.dump());
  e = error_of([&] { run("import", path("r.db"), nullptr, path("bad_row.json")); });
  EXPECT_NE(e.find(path("bad_row.json") + ": row 3"), std::string::npos) << e;
  EXPECT_NE(e.find("config"), std::string::npos) << e;
  EXPECT_EQ(reg.count(), 1);
  EXPECT_THROW(reg.import_json(doc, "doc"), UserError);
  EXPECT_EQ(reg.count(), 1);
  // Other shapes of wrong.
  write("array.json", "[]");
  EXPECT_NE(error_of([&] { run("import", path("r.db"), nullptr, path("array.json")); }).find("not a FACT registry export"),
            std::string::npos);
  doc = good.export_json();
  doc["rows"][0]["disposition"] = "great";
  EXPECT_NE(error_of([&] { reg.import_json(doc, "d"); }).find("disposition 'great'"), std::string::npos);
  doc = good.export_json();
  doc["rows"][0].erase("time_us");  // a passed row without a time is not a measurement
  EXPECT_NE(error_of([&] { reg.import_json(doc, "d"); }).find("time_us"), std::string::npos);
  doc["fact_registry_export"] = 2;
  EXPECT_NE(error_of([&] { reg.import_json(doc, "d"); }).find("export format 2"), std::string::npos);
  EXPECT_EQ(reg.count(), 1);
  // A missing file is named, and no registry is created for it.
  e = error_of([&] { run("import", path("new.db"), nullptr, path("absent.json")); });
  EXPECT_NE(e.find(path("absent.json") + ": no such file"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(path("new.db")));
  e = error_of([&] { run("import", path("new.db"), nullptr, path("bad_row.json")); });
  EXPECT_FALSE(e.empty());
  EXPECT_FALSE(fs::exists(path("new.db")));
}

TEST_F(RegistryCli, DuplicateImportIsIdempotent) {
  auto src = Registry::open_writable(path("src.db"));
  fill(src);
  auto doc = src.export_json();
  auto dst = Registry::open_writable(path("dst.db"));
  EXPECT_EQ(dst.import_json(doc).inserted, 3u);
  const auto before = contents(dst);
  const auto again = dst.import_json(doc);
  EXPECT_EQ(again.inserted, 0u);
  EXPECT_EQ(again.skipped, 3u);
  EXPECT_EQ(contents(dst), before);
  // Duplicates inside one document, and a same-config row with another time, count as present.
  doc["rows"].push_back(doc["rows"][0]);
  doc["rows"][3]["time_us"] = 1.0;
  auto other = Registry::open_writable(path("other.db"));
  const auto s = other.import_json(doc);
  EXPECT_EQ(s.inserted, 3u);
  EXPECT_EQ(s.skipped, 1u);
  // A new row alongside old ones: only it is added.
  src.insert(row("gemm[]:f16,f16->f16:row,row", 64, 3.5, "d"));
  write("more.json", src.export_json().dump());
  std::string out;
  EXPECT_EQ(run("import", path("dst.db"), &out, path("more.json")), 0);
  EXPECT_NE(out.find("1 imported, 0 updated (measured later), 3 already present"), std::string::npos) << out;
  EXPECT_EQ(dst.count(), 4);
}

TEST_F(RegistryCli, ALaterMeasurementReplacesTheStoredOne) {
  auto src = Registry::open_writable(path("src.db"));
  fill(src);
  auto doc = src.export_json();
  for (auto& r : doc["rows"]) r["created"] = "2026-01-01 00:00:00";
  auto dst = Registry::open_writable(path("dst.db"));
  EXPECT_EQ(dst.import_json(doc).inserted, 3u);
  // Re-tuned later: new time and provenance; one row measured earlier than what is stored.
  doc["rows"][0]["created"] = "2026-02-01 00:00:00";
  doc["rows"][0]["time_us"] = 1.25;
  doc["rows"][0]["provenance"] = "tuned";
  doc["rows"][1]["created"] = "2025-12-01 00:00:00";
  doc["rows"][1]["time_us"] = 99.0;
  const auto s = dst.import_json(doc);
  EXPECT_EQ(s.inserted, 0u);
  EXPECT_EQ(s.updated, 1u);
  EXPECT_EQ(s.skipped, 2u);
  EXPECT_EQ(dst.count(), 3);  // replaced in place, not added
  bool saw_new = false, saw_old_kept = false;
  for (const auto& e : dst.list({})) {
    if (e.row.time_us == 1.25 && e.row.provenance == "tuned" && e.created == "2026-02-01 00:00:00") saw_new = true;
    if (e.row.time_us == 99.0) saw_old_kept = true;
  }
  EXPECT_TRUE(saw_new);
  EXPECT_FALSE(saw_old_kept);
  // A later failure of a passed kernel (a transient fault) does not replace the measurement.
  doc["rows"][0]["created"] = "2026-03-01 00:00:00";
  doc["rows"][0]["disposition"] = "fault";
  ASSERT_EQ(doc["rows"][0]["time_us"], 1.25);
  EXPECT_EQ(dst.import_json(doc).updated, 0u);
  for (const auto& e : dst.list({})) {
    if (e.row.time_us == 1.25) EXPECT_EQ(e.row.disposition, "passed");
  }
}

TEST_F(RegistryCli, MeasuredAnswersPerKernelOfARun) {
  // What tuning asks: per built kernel of a realize run, the fastest passed row for what it
  // computes ("measures") at that problem, arch and config name; null where there is none.
  auto reg = Registry::open_writable(path("r.db"));
  fill(reg);
  reg.insert(row("gemm[bias+gelu_tanh]:bf16,bf16->bf16:row,col", 4096, 99.0, "a"));  // faster, same config
  reg.insert(row("gemm[bias+gelu_tanh]:bf16,bf16->bf16:row,col", 4096, 50.0, "z", "incorrect"));
  reg.insert(row("gemm[bias+gelu_tanh]:bf16,bf16->bf16:row,col", 4096, 0.0, "a"));  // passed, no time
  const json problem = {{"batch", 1}, {"m", 4096}, {"n", 3072}, {"k", 768}};
  const json measures = {{"family", "gemm"}, {"signature", "gemm[bias+gelu_tanh]:bf16,bf16->bf16:row,col"},
                         {"problem", problem}};
  fs::create_directories(dir_ / "run");
  write("run/plan.json", json({{"arch", "sm90"}, {"patterns", json::array()}}).dump());
  json manifest = json::array();
  for (const char* name : {"a", "b", "z"}) {
    manifest.push_back({{"pattern_index", 0}, {"kernel", std::string("k_") + name}, {"library", "lib/x.so"},
                        {"config", {{"name", name}}}, {"measures", measures}});
  }
  manifest.push_back({{"pattern_index", 1}, {"status", "not_supported"}});  // nothing built: not listed
  write("run/manifest.json", manifest.dump());
  std::string out;
  ASSERT_EQ(run("measured", path("r.db"), &out, path("run")), 0);
  const json doc = json::parse(out);
  ASSERT_EQ(doc["kernels"].size(), 3u);
  EXPECT_EQ(doc["kernels"][0]["kernel"], "k_a");
  EXPECT_EQ(doc["kernels"][0]["row"]["time_us"], 99.0);
  EXPECT_TRUE(doc["kernels"][1]["row"].is_null());  // "b" was timed at another m only
  EXPECT_TRUE(doc["kernels"][2]["row"].is_null());  // "z" never passed
  // A manifest from before "measures" is refused with what to do.
  manifest[0].erase("measures");
  write("run/manifest.json", manifest.dump());
  const auto why = error_of([&] { run("measured", path("r.db"), nullptr, path("run")); });
  EXPECT_NE(why.find("run fact realize again"), std::string::npos) << why;
  // A registry that does not exist is said by name, as for export.
  EXPECT_NE(error_of([&] { run("measured", path("none.db"), nullptr, path("run")); }).find("does not exist"),
            std::string::npos);
}

TEST_F(RegistryCli, SeedFileImports) {
  const std::string seed = std::string(FACT_TEST_DATA) + "/../../../data/registry_seed.json";
  const auto doc = cli::read_json_file(seed);
  EXPECT_TRUE(doc["rows"].is_array());
  EXPECT_TRUE(doc["produced_by"].is_object());
  std::string out;
  EXPECT_EQ(run("import", path("seeded.db"), &out, seed), 0);
  EXPECT_NE(out.find("imported"), std::string::npos) << out;
  const auto reg = Registry::open_readonly(path("seeded.db"));
  ASSERT_TRUE(reg);
  EXPECT_EQ(reg->count(), static_cast<int64_t>(doc["rows"].size()));
  // Importing it twice is harmless.
  EXPECT_EQ(run("import", path("seeded.db"), &out, seed), 0);
  EXPECT_EQ(Registry::open_readonly(path("seeded.db"))->count(), static_cast<int64_t>(doc["rows"].size()));
}

#ifdef FACT_HAVE_CLI11
TEST_F(RegistryCli, CommandLineParses) {
  auto parse = [](std::vector<std::string> args, cli::RegistryCommand& cmd) {
    CLI::App app;
    app.require_subcommand(1);
    auto* reg = cli::add_registry_command(app, cmd);
    std::reverse(args.begin(), args.end());  // CLI11 takes a reversed vector
    app.parse(args);
    return static_cast<bool>(*reg);
  };
  cli::RegistryCommand a;
  EXPECT_TRUE(parse({"registry", "import", "seed.json", "--registry", "x.db"}, a));
  EXPECT_EQ(a.action, "import");
  EXPECT_EQ(a.file, "seed.json");
  EXPECT_EQ(a.registry_path, "x.db");
  cli::RegistryCommand b;
  parse({"registry", "show", "7"}, b);
  EXPECT_EQ(b.action, "show");
  EXPECT_EQ(b.id, 7);
  cli::RegistryCommand c;
  parse({"registry", "export", "-o", "out.json"}, c);
  EXPECT_EQ(c.action, "export");
  EXPECT_EQ(c.output, "out.json");
  cli::RegistryCommand d;
  parse({"registry", "list", "--signature", "gemm[", "--limit", "5"}, d);
  EXPECT_EQ(d.action, "list");
  EXPECT_EQ(d.filter.signature, "gemm[");
  EXPECT_EQ(d.filter.limit, 5u);
  cli::RegistryCommand e;
  EXPECT_THROW(parse({"registry", "import"}, e), CLI::ParseError);
}
#endif

}  // namespace
}  // namespace fact
