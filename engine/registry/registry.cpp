#include "registry/registry.h"

#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "discover/pattern.h"
#include "ir/error.h"

namespace fact::registry {

namespace {

[[noreturn]] void fail(sqlite3* db, const std::string& path, const std::string& what) {
  throw UserError("registry " + path + ": " + what + ": " + (db ? sqlite3_errmsg(db) : "cannot open"));
}

void exec(sqlite3* db, const std::string& path, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "?";
    sqlite3_free(err);
    throw UserError("registry " + path + ": " + msg);
  }
}

struct Stmt {
  sqlite3_stmt* s = nullptr;
  Stmt(sqlite3* db, const std::string& path, const char* sql) {
    if (sqlite3_prepare_v2(db, sql, -1, &s, nullptr) != SQLITE_OK) fail(db, path, "bad query");
  }
  ~Stmt() { sqlite3_finalize(s); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  void bind(int i, const std::string& v) { sqlite3_bind_text(s, i, v.c_str(), -1, SQLITE_TRANSIENT); }
  void bind(int i, double v) { sqlite3_bind_double(s, i, v); }
  std::string text(int i) const {
    const auto* t = sqlite3_column_text(s, i);
    return t ? reinterpret_cast<const char*>(t) : "";
  }
};

// Log-distance between two problems over the numeric sizes they share.
double distance(const nlohmann::json& a, const nlohmann::json& b) {
  double d = 0;
  int shared = 0;
  for (const auto& [k, v] : a.items()) {
    if (!v.is_number() || !b.contains(k) || !b[k].is_number()) continue;
    const double x = std::max(1.0, v.get<double>()), y = std::max(1.0, b[k].get<double>());
    d += std::fabs(std::log2(x) - std::log2(y));
    ++shared;
  }
  return shared ? d : INFINITY;
}

}  // namespace

std::string signature(const discover::Match& m) {
  std::string s = discover::family_name(m.family);
  s += "[";
  for (size_t i = 0; i < m.epilogue.size(); ++i) s += (i ? "+" : "") + m.epilogue[i];
  s += "]";
  const auto& a = m.attrs;
  if (a.contains("dtype_a")) {
    s += ":" + a["dtype_a"].get<std::string>() + "," + a["dtype_b"].get<std::string>() + "->" +
         a["dtype_out"].get<std::string>() + ":" + a["layout_a"].get<std::string>() + "," +
         a["layout_b"].get<std::string>();
  } else if (a.contains("dtype")) {
    s += ":" + a["dtype"].get<std::string>();
    if (a.value("causal", false)) s += ":causal";
  } else if (a.contains("dtype_in")) {
    s += ":" + a["dtype_in"].get<std::string>() + "->" + a["dtype_out"].get<std::string>() + ":" +
         a["kind"].get<std::string>();
  }
  return s;
}

std::string Registry::default_path() {
  if (const char* p = std::getenv("FACT_REGISTRY"); p && *p) return p;
  std::filesystem::path base;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    base = x;
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    base = std::filesystem::path(h) / ".cache";
  } else {
    base = ".";
  }
  return (base / "fact" / "registry.db").string();
}

std::optional<Registry> Registry::open_readonly(const std::string& path) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    fail(nullptr, path, "cannot open");
  }
  Registry r(db, path);
  r.check_schema(false);
  return r;
}

Registry Registry::open_writable(const std::string& path) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    fail(nullptr, path, "cannot open");
  }
  Registry r(db, path);
  exec(db, path, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=5000;");
  r.check_schema(true);
  return r;
}

Registry::Registry(Registry&& o) noexcept : db_(o.db_), path_(std::move(o.path_)) { o.db_ = nullptr; }
Registry& Registry::operator=(Registry&& o) noexcept {
  std::swap(db_, o.db_);
  std::swap(path_, o.path_);
  return *this;
}
Registry::~Registry() { sqlite3_close(db_); }

void Registry::check_schema(bool create) {
  if (create) {
    exec(db_, path_,
         "BEGIN;"
         "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
         "INSERT OR IGNORE INTO meta VALUES('schema_version', '1');"
         "CREATE TABLE IF NOT EXISTS results("
         "  id INTEGER PRIMARY KEY,"
         "  signature TEXT NOT NULL, arch TEXT NOT NULL, problem TEXT NOT NULL,"
         "  config TEXT NOT NULL, time_us REAL, error REAL,"
         "  disposition TEXT NOT NULL, provenance TEXT NOT NULL,"
         "  created TEXT NOT NULL DEFAULT (datetime('now')));"
         "CREATE INDEX IF NOT EXISTS results_by_signature ON results(signature, arch);"
         "COMMIT;");
  }
  Stmt q(db_, path_, "SELECT value FROM meta WHERE key = 'schema_version'");
  if (sqlite3_step(q.s) != SQLITE_ROW) fail(db_, path_, "not a FACT registry (no schema version)");
  const auto version = q.text(0);
  if (version != std::to_string(kSchemaVersion)) {
    throw UserError("registry " + path_ + ": schema version " + version + " is not supported (this FACT reads " +
                    std::to_string(kSchemaVersion) + "); point --registry at another file");
  }
}

void Registry::insert(const Row& row) {
  exec(db_, path_, "BEGIN IMMEDIATE;");
  try {
    Stmt q(db_, path_,
           "INSERT INTO results(signature, arch, problem, config, time_us, error, disposition, provenance)"
           " VALUES(?, ?, ?, ?, ?, ?, ?, ?)");
    q.bind(1, row.signature);
    q.bind(2, row.arch);
    q.bind(3, row.problem.dump());
    q.bind(4, row.config.dump());
    q.bind(5, row.time_us);
    q.bind(6, row.error);
    q.bind(7, row.disposition);
    q.bind(8, row.provenance);
    if (sqlite3_step(q.s) != SQLITE_DONE) fail(db_, path_, "insert failed");
  } catch (...) {
    sqlite3_exec(db_, "ROLLBACK;", nullptr, nullptr, nullptr);
    throw;
  }
  exec(db_, path_, "COMMIT;");
}

std::vector<Hit> Registry::lookup(const std::string& sig, const std::string& arch,
                                  const nlohmann::json& problem, size_t limit) const {
  Stmt q(db_, path_,
         "SELECT problem, config, time_us, error, disposition, provenance FROM results"
         " WHERE signature = ? AND arch = ? AND disposition = 'passed'");
  q.bind(1, sig);
  q.bind(2, arch);
  std::vector<Hit> hits;
  while (sqlite3_step(q.s) == SQLITE_ROW) {
    Hit h;
    h.row.signature = sig;
    h.row.arch = arch;
    h.row.problem = nlohmann::json::parse(q.text(0), nullptr, false);
    h.row.config = nlohmann::json::parse(q.text(1), nullptr, false);
    h.row.time_us = sqlite3_column_double(q.s, 2);
    h.row.error = sqlite3_column_double(q.s, 3);
    h.row.disposition = q.text(4);
    h.row.provenance = q.text(5);
    if (h.row.problem.is_discarded() || h.row.config.is_discarded()) continue;
    h.distance = h.row.problem == problem ? 0.0 : distance(problem, h.row.problem);
    h.match = h.distance == 0.0 ? "exact" : "nearest";
    if (std::isfinite(h.distance)) hits.push_back(std::move(h));
  }
  std::stable_sort(hits.begin(), hits.end(), [](const Hit& a, const Hit& b) {
    return a.distance != b.distance ? a.distance < b.distance : a.row.time_us < b.row.time_us;
  });
  if (hits.size() > limit) hits.resize(limit);
  return hits;
}

int64_t Registry::count() const {
  Stmt q(db_, path_, "SELECT COUNT(*) FROM results");
  return sqlite3_step(q.s) == SQLITE_ROW ? sqlite3_column_int64(q.s, 0) : 0;
}

}  // namespace fact::registry
