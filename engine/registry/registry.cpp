#include "registry/registry.h"

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <regex>
#include <thread>

#include "discover/lowering.h"
#include "discover/pattern.h"
#include "ir/error.h"

namespace fact::registry {

namespace {

// Another connection holds a lock this one could not wait for (SQLite returns some of these
// without calling the busy handler: WAL recovery, a journal-mode switch in progress).
struct Busy : UserError {
  using UserError::UserError;
};

bool is_busy(int rc) { return (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED; }

[[noreturn]] void fail(sqlite3* db, const std::string& path, const std::string& what) {
  const std::string msg = "registry " + path + ": " + what + ": " + (db ? sqlite3_errmsg(db) : "cannot open");
  if (db && is_busy(sqlite3_extended_errcode(db))) throw Busy(msg);
  throw UserError(msg);
}

void exec(sqlite3* db, const std::string& path, const char* sql) {
  char* err = nullptr;
  if (const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err); rc != SQLITE_OK) {
    std::string msg = "registry " + path + ": " + (err ? err : "?");
    sqlite3_free(err);
    sqlite3_exec(db, "ROLLBACK;", nullptr, nullptr, nullptr);  // no transaction left half open
    if (is_busy(rc)) throw Busy(msg);
    throw UserError(msg);
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
  void bind_int(int i, int64_t v) { sqlite3_bind_int64(s, i, v); }
  std::string text(int i) const {
    const auto* t = sqlite3_column_text(s, i);
    return t ? reinterpret_cast<const char*>(t) : "";
  }
  void reset() {  // for the next row: bindings back to NULL
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
  }
};

// Log-distance between two problems over the numeric sizes they share, plus 1 for each other
// key whose value differs or that one of them lacks (a horizontal GEMM's n_parts): only equal
// problems are at distance 0. Infinite when they share no numeric size.
double distance(const nlohmann::json& a, const nlohmann::json& b) {
  double d = 0;
  int shared = 0;
  for (const auto& [k, v] : a.items()) {
    if (v.is_number() && b.contains(k) && b[k].is_number()) {
      const double x = std::max(1.0, v.get<double>()), y = std::max(1.0, b[k].get<double>());
      d += std::fabs(std::log2(x) - std::log2(y));
      ++shared;
    } else if (!b.contains(k) || b[k] != v) {
      d += 1.0;
    }
  }
  for (const auto& [k, v] : b.items()) {
    if (!a.contains(k)) d += 1.0;
  }
  return shared ? d : INFINITY;
}

// The columns an Entry is read from, in this order (knobs last: Registry::columns()).
constexpr const char* kEntryColumns =
    "id, signature, arch, problem, config, time_us, error, disposition, provenance, created";

nlohmann::json json_object_or_empty(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  return j.is_object() ? j : nlohmann::json::object();
}

Entry read_entry(const Stmt& q) {
  Entry e;
  e.id = sqlite3_column_int64(q.s, 0);
  e.row.signature = q.text(1);
  e.row.arch = q.text(2);
  // A cell that is not JSON (hand-edited file) comes back as a string rather than failing the
  // whole listing: `show` and `export` then display what is really there.
  e.row.problem = nlohmann::json::parse(q.text(3), nullptr, false);
  if (e.row.problem.is_discarded()) e.row.problem = q.text(3);
  e.row.config = nlohmann::json::parse(q.text(4), nullptr, false);
  if (e.row.config.is_discarded()) e.row.config = q.text(4);
  e.row.time_us = sqlite3_column_double(q.s, 5);
  e.row.error = sqlite3_column_double(q.s, 6);
  e.row.disposition = q.text(7);
  e.row.provenance = q.text(8);
  e.created = q.text(9);
  e.row.knobs = json_object_or_empty(q.text(10));
  return e;
}

// Writes one row; the caller holds the transaction. `created` empty: now.
void insert_row(sqlite3* db, const std::string& path, const Row& row, const std::string& created) {
  Stmt q(db, path,
         "INSERT INTO results(signature, arch, problem, config, time_us, error, disposition, provenance, created,"
         " knobs) VALUES(?, ?, ?, ?, ?, ?, ?, ?, COALESCE(?, datetime('now')), ?)");
  q.bind(1, row.signature);
  q.bind(2, row.arch);
  q.bind(3, row.problem.dump());
  q.bind(4, row.config.dump());
  q.bind(5, row.time_us);
  q.bind(6, row.error);
  q.bind(7, row.disposition);
  q.bind(8, row.provenance);
  if (!created.empty()) q.bind(9, created);  // unbound parameters are NULL
  q.bind(10, row.knobs.dump());
  if (sqlite3_step(q.s) != SQLITE_DONE) fail(db, path, "insert failed");
}

const std::vector<std::string>& dispositions() {
  static const std::vector<std::string> v = {"passed", "incorrect", "fault", "compile_error", "not_supported"};
  return v;
}
const std::vector<std::string>& provenances() {
  static const std::vector<std::string> v = {"seed", "tuned", "agent"};
  return v;
}

std::string one_of(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

}  // namespace

nlohmann::json Entry::to_json() const {
  return {{"id", id},
          {"signature", row.signature},
          {"arch", row.arch},
          {"problem", row.problem},
          {"config", row.config},
          {"time_us", row.time_us},
          {"error", row.error},
          {"disposition", row.disposition},
          {"provenance", row.provenance},
          {"created", created},
          {"knobs", row.knobs}};
}

Row row_from_json(const nlohmann::json& j, const std::string& where) {
  auto bad = [&](const std::string& what) -> UserError { return UserError(where + ": " + what); };
  if (!j.is_object()) throw bad("a row must be a JSON object, got " + std::string(j.type_name()));
  // Text is printable: a NUL would cut the string short in SQLite's C API, a control character
  // would garble every listing.
  auto printable = [&](const std::string& key, const std::string& value) {
    for (unsigned char ch : value) {
      if (ch < 0x20 || ch == 0x7f) throw bad("'" + key + "' holds a control character (code " + std::to_string(ch) + ")");
    }
  };
  auto text = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_string() || j[key].get<std::string>().empty()) {
      throw bad(std::string("needs a non-empty string '") + key + "'");
    }
    const auto value = j[key].get<std::string>();
    printable(key, value);
    if (value.size() > 4096) throw bad(std::string("'") + key + "' is longer than 4096 characters");
    return value;
  };
  auto object = [&](const char* key) {
    if (!j.contains(key) || !j[key].is_object()) throw bad(std::string("needs an object '") + key + "'");
    return j[key];
  };
  // Numbers may be null or absent for rows that never produced one (a compile error has no time).
  auto number = [&](const char* key, bool required) {
    if (j.contains(key) && j[key].is_number()) {
      const double v = j[key].get<double>();
      if (!std::isfinite(v) || v < 0) throw bad(std::string("'") + key + "' must be a finite number >= 0");
      return v;
    }
    if (required) throw bad(std::string("needs a number '") + key + "'");
    if (j.contains(key) && !j[key].is_null()) throw bad(std::string("'") + key + "' must be a number or null");
    return 0.0;
  };
  Row r;
  r.signature = text("signature");
  r.arch = text("arch");
  r.problem = object("problem");
  r.config = object("config");
  r.disposition = text("disposition");
  r.provenance = text("provenance");
  const auto& d = dispositions();
  if (std::find(d.begin(), d.end(), r.disposition) == d.end()) {
    throw bad("disposition '" + r.disposition + "' is not one of " + one_of(d));
  }
  const auto& p = provenances();
  if (std::find(p.begin(), p.end(), r.provenance) == p.end()) {
    throw bad("provenance '" + r.provenance + "' is not one of " + one_of(p));
  }
  // A passed row is a measurement: it must say how long it took.
  r.time_us = number("time_us", r.disposition == "passed");
  r.error = number("error", false);
  if (j.contains("created") && !j["created"].is_string() && !j["created"].is_null()) {
    throw bad("'created' must be a string");
  }
  if (j.contains("created") && j["created"].is_string()) {
    // SQLite's datetime text, which later imports compare as text: "YYYY-MM-DD HH:MM:SS"
    static const std::regex date(R"(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d+)?Z?)");
    if (!std::regex_match(j["created"].get<std::string>(), date)) {
      throw bad("'created' is not a date and time like 2026-12-07 16:30:00: " + j["created"].dump());
    }
  }
  if (r.disposition == "passed" && r.time_us <= 0) throw bad("a passed row needs a time_us above 0");
  for (const auto* doc : {&r.problem, &r.config}) {
    if (doc->dump().find("\\u0000") != std::string::npos) throw bad("'problem' and 'config' must not hold NUL characters");
  }
  if (j.contains("knobs") && !j["knobs"].is_null()) {
    if (!j["knobs"].is_object()) throw bad("'knobs' must be an object");
    r.knobs = j["knobs"];
  }
  return r;
}

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
    // Attention whose V has its keys contiguous (a projection that wrote V^T): Hopper's TF32
    // kernels read it in place and the others copy it first, so its times are kept apart
    if (const auto v = a.find("v_strides"); m.family == discover::Family::attention && v != a.end() &&
        v->is_array() && v->size() == 4 && (*v)[2] == 1 && (*v)[3].is_number_integer() &&
        (*v)[3].get<int64_t>() > 1) {
      s += ":v_keys";
    }
  } else if (a.contains("inputs")) {  // pointwise: the operands' dtypes
    s += ":" + a["inputs"].get<std::string>() + "->" + a["dtype_out"].get<std::string>();
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
  // Concurrent first writers of a new file queue: on the busy timeout where SQLite waits, and
  // by opening again after a short random pause where it returns "locked" at once.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::minstd_rand jitter(std::random_device{}());
  while (true) {
    sqlite3* db = nullptr;
    if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) != SQLITE_OK) {
      sqlite3_close(db);
      fail(nullptr, path, "cannot open");
    }
    Registry r(db, path);
    try {
      sqlite3_busy_timeout(db, 5000);
      exec(db, path, "PRAGMA busy_timeout=5000; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;");
      r.check_schema(true);
      return r;
    } catch (const Busy&) {
      if (std::chrono::steady_clock::now() > deadline) throw;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10 + jitter() % 90));
  }
}

Registry::Registry(Registry&& o) noexcept
    : db_(o.db_), path_(std::move(o.path_)), knobs_column_(o.knobs_column_) {
  o.db_ = nullptr;
}
Registry& Registry::operator=(Registry&& o) noexcept {
  std::swap(db_, o.db_);
  std::swap(path_, o.path_);
  std::swap(knobs_column_, o.knobs_column_);
  return *this;
}
Registry::~Registry() { sqlite3_close(db_); }

void Registry::check_schema(bool create) {
  if (create) {
    // IMMEDIATE: take the write lock first, so concurrent openers queue on busy_timeout
    // instead of failing to upgrade a read lock.
    exec(db_, path_,
         "BEGIN IMMEDIATE;"
         "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
         "INSERT OR IGNORE INTO meta VALUES('schema_version', '2');"
         "CREATE TABLE IF NOT EXISTS results("
         "  id INTEGER PRIMARY KEY,"
         "  signature TEXT NOT NULL, arch TEXT NOT NULL, problem TEXT NOT NULL,"
         "  config TEXT NOT NULL, time_us REAL, error REAL,"
         "  disposition TEXT NOT NULL, provenance TEXT NOT NULL,"
         "  created TEXT NOT NULL DEFAULT (datetime('now')),"
         "  knobs TEXT NOT NULL DEFAULT '{}');"
         "CREATE INDEX IF NOT EXISTS results_by_signature ON results(signature, arch);"
         "CREATE TABLE IF NOT EXISTS proposals("
         "  id INTEGER PRIMARY KEY, kind TEXT NOT NULL, key TEXT NOT NULL, payload TEXT NOT NULL,"
         "  status TEXT NOT NULL, gates TEXT NOT NULL DEFAULT '[]',"
         "  provenance TEXT NOT NULL DEFAULT '{}',"
         "  created TEXT NOT NULL DEFAULT (datetime('now')), UNIQUE(kind, key, payload));"
         "COMMIT;");
    // An import's duplicate check looks rows up by their whole key: without this index it
    // scanned every row of the signature, quadratic in a team registry's size.
    exec(db_, path_, "CREATE INDEX IF NOT EXISTS results_by_key ON results(signature, arch, problem, config, created);");
  }
  std::string version;
  {
    Stmt q(db_, path_, "SELECT value FROM meta WHERE key = 'schema_version'");
    if (sqlite3_step(q.s) != SQLITE_ROW) fail(db_, path_, "not a FACT registry (no schema version)");
    version = q.text(0);
  }
  if (version == "1") {
    if (!create) {
      knobs_column_ = false;  // read-only: rows read with knobs {}
      return;
    }
    // Schema 1 -> 2: the rows' launch knobs, unknown ({}) for what was stored before. The
    // version is read again under the write lock: another process may have migrated first.
    exec(db_, path_, "BEGIN IMMEDIATE;");
    try {
      Stmt again(db_, path_, "SELECT value FROM meta WHERE key = 'schema_version'");
      if (sqlite3_step(again.s) == SQLITE_ROW && again.text(0) == "1") {
        exec(db_, path_,
             "ALTER TABLE results ADD COLUMN knobs TEXT NOT NULL DEFAULT '{}';"
             "UPDATE meta SET value = '2' WHERE key = 'schema_version';");
      }
    } catch (...) {
      sqlite3_exec(db_, "ROLLBACK;", nullptr, nullptr, nullptr);
      throw;
    }
    exec(db_, path_, "COMMIT;");
    version = "2";
  }
  if (version != std::to_string(kSchemaVersion)) {
    throw UserError("registry " + path_ + ": schema version " + version + " is not supported (this FACT reads " +
                    std::to_string(kSchemaVersion) + " and migrates 1); point --registry at another file");
  }
}

std::string Registry::knobs_sql() const { return knobs_column_ ? "knobs" : "'{}'"; }

std::string Registry::columns() const { return std::string(kEntryColumns) + ", " + knobs_sql(); }

void Registry::insert(const Row& row) {
  exec(db_, path_, "BEGIN IMMEDIATE;");
  try {
    insert_row(db_, path_, row, "");
  } catch (...) {
    sqlite3_exec(db_, "ROLLBACK;", nullptr, nullptr, nullptr);
    throw;
  }
  exec(db_, path_, "COMMIT;");
}

std::vector<Hit> Registry::lookup(const std::string& sig, const std::string& arch,
                                  const nlohmann::json& problem, size_t limit) const {
  Stmt q(db_, path_,
         (std::string("SELECT problem, config, time_us, error, disposition, provenance, ") +
          knobs_sql() + " FROM results WHERE signature = ? AND arch = ? AND disposition = 'passed'")
             .c_str());
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
    h.row.knobs = json_object_or_empty(q.text(6));
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

std::vector<Entry> Registry::list(const ListFilter& f) const {
  // Filters are bound as parameters, never spliced into the SQL text. The signature filter is a
  // plain substring (instr), so '[' and '_' in signatures need no escaping as with LIKE.
  std::string sql = "SELECT " + columns() + " FROM results WHERE 1";
  std::vector<std::string> args;
  if (!f.signature.empty()) {
    sql += " AND instr(signature, ?) > 0";
    args.push_back(f.signature);
  }
  if (!f.arch.empty()) {
    sql += " AND arch = ?";
    args.push_back(f.arch);
  }
  if (!f.disposition.empty()) {
    sql += " AND disposition = ?";
    args.push_back(f.disposition);
  }
  if (!f.provenance.empty()) {
    sql += " AND provenance = ?";
    args.push_back(f.provenance);
  }
  sql += " ORDER BY id";
  if (f.limit) sql += " LIMIT " + std::to_string(f.limit);
  Stmt q(db_, path_, sql.c_str());
  for (size_t i = 0; i < args.size(); ++i) q.bind(static_cast<int>(i + 1), args[i]);
  std::vector<Entry> out;
  int rc;
  while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) out.push_back(read_entry(q));
  if (rc != SQLITE_DONE) fail(db_, path_, "list failed");
  return out;
}

std::optional<Entry> Registry::get(int64_t id) const {
  Stmt q(db_, path_, ("SELECT " + columns() + " FROM results WHERE id = ?").c_str());
  q.bind_int(1, id);
  if (sqlite3_step(q.s) != SQLITE_ROW) return std::nullopt;
  return read_entry(q);
}

std::vector<Entry> Registry::salvage(int64_t& unreadable) const {
  unreadable = 0;
  int64_t top = 0;
  try {
    Stmt q(db_, path_, "SELECT MAX(id) FROM results");
    if (sqlite3_step(q.s) == SQLITE_ROW) top = sqlite3_column_int64(q.s, 0);
  } catch (const std::exception&) {
    top = 1 << 24;  // no index to ask: try ids up to a large bound
  }
  std::vector<Entry> out;
  int64_t misses = 0;
  for (int64_t id = 1; id <= top && misses < 100000; ++id) {
    try {
      if (auto e = get(id)) {
        out.push_back(std::move(*e));
        misses = 0;
      } else {
        ++misses;
      }
    } catch (const std::exception&) {
      ++unreadable;
    }
  }
  return out;
}

bool Registry::remove(int64_t id) {
  Stmt q(db_, path_, "DELETE FROM results WHERE id = ?");
  q.bind_int(1, id);
  if (sqlite3_step(q.s) != SQLITE_DONE) fail(db_, path_, "delete failed");
  return sqlite3_changes(db_) > 0;
}

nlohmann::json Registry::export_json(const nlohmann::json& produced_by) const {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& e : list()) rows.push_back(e.to_json());
  return {{"fact_registry_export", kExportFormatVersion},
          {"schema_version", kSchemaVersion},
          {"produced_by", produced_by},
          {"rows", rows}};
}

void check_export(const nlohmann::json& doc, const std::string& source) {
  if (!doc.is_object() || !doc.contains("fact_registry_export")) {
    throw UserError(source + ": not a FACT registry export (no \"fact_registry_export\" key; make one with "
                             "`fact-engine registry export`)");
  }
  const auto& version = doc["fact_registry_export"];
  if (!version.is_number_integer() || version.get<int64_t>() != kExportFormatVersion) {
    throw UserError(source + ": export format " + version.dump() + " is not supported (this FACT reads " +
                    std::to_string(kExportFormatVersion) + ")");
  }
  if (!doc.contains("rows") || !doc["rows"].is_array()) throw UserError(source + ": needs a \"rows\" list");
  for (size_t i = 0; i < doc["rows"].size(); ++i) row_from_json(doc["rows"][i], source + ": row " + std::to_string(i + 1));
}

// When a seed row without a timestamp was measured, as far as a later import can tell: long
// ago, so every measurement is newer.
constexpr const char* kSeedCreated = "1970-01-01 00:00:00";

ImportStats Registry::import_json(const nlohmann::json& doc, const std::string& source) {
  // Validate everything before writing anything.
  check_export(doc, source);
  std::vector<std::pair<Row, std::string>> rows;
  for (const auto& j : doc["rows"]) {
    rows.emplace_back(row_from_json(j, source),
                      j.contains("created") && j["created"].is_string() ? j["created"].get<std::string>() : "");
  }
  ImportStats stats;
  stats.rows = rows.size();
  exec(db_, path_, "BEGIN IMMEDIATE;");
  try {
    // Prepared once, reset per row: a million-row import is then one B-tree lookup a row.
    // A seed row (the shipped, vetted examples) never replaces a measurement, and without a
    // timestamp it counts as old, not as now: re-running setup keeps every tuned row.
    Stmt q(db_, path_,
           "SELECT id, created < COALESCE(?, datetime('now'))"
           " AND (disposition != 'passed' OR ? = 'passed') AND (? != 'seed' OR provenance = 'seed')"
           " FROM results"
           " WHERE signature = ? AND arch = ? AND problem = ? AND config = ?"
           " ORDER BY created DESC LIMIT 1");
    Stmt u(db_, path_,
           "UPDATE results SET time_us = ?, error = ?, disposition = ?, provenance = ?,"
           " created = COALESCE(?, datetime('now')), knobs = ? WHERE id = ?");
    for (auto& [row, created] : rows) {
      if (created.empty() && row.provenance == "seed") created = kSeedCreated;
      // Duplicates by (signature, arch, problem, config). JSON cells are compared as dump()
      // text, which nlohmann writes with sorted keys and no spaces: the form insert() stores.
      // A later measurement of the same kernel replaces the stored one (times drift with
      // drivers and libraries); an older or equally old one is skipped, and so is a later
      // failure (a fault may be transient) over a passed row.
      q.reset();
      if (!created.empty()) q.bind(1, created);
      q.bind(2, row.disposition);  // a failed re-measurement does not replace a passed one
      q.bind(3, row.provenance);
      q.bind(4, row.signature);
      q.bind(5, row.arch);
      q.bind(6, row.problem.dump());
      q.bind(7, row.config.dump());
      const int rc = sqlite3_step(q.s);
      if (rc == SQLITE_ROW) {
        if (sqlite3_column_int(q.s, 1) == 0) {
          ++stats.skipped;
          continue;
        }
        u.reset();
        u.bind(1, row.time_us);
        u.bind(2, row.error);
        u.bind(3, row.disposition);
        u.bind(4, row.provenance);
        if (!created.empty()) u.bind(5, created);
        u.bind(6, row.knobs.dump());
        u.bind_int(7, sqlite3_column_int64(q.s, 0));
        if (sqlite3_step(u.s) != SQLITE_DONE) fail(db_, path_, "update failed");
        ++stats.updated;
        continue;
      }
      if (rc != SQLITE_DONE) fail(db_, path_, "duplicate check failed");
      insert_row(db_, path_, row, created);
      ++stats.inserted;
    }
    exec(db_, path_, "COMMIT;");  // inside the try: a failed commit is rolled back too
  } catch (...) {
    sqlite3_exec(db_, "ROLLBACK;", nullptr, nullptr, nullptr);
    throw;
  }
  return stats;
}

nlohmann::json Proposal::to_json() const {
  return {{"id", id},         {"kind", kind},   {"key", key},         {"payload", payload},
          {"status", status}, {"gates", gates}, {"provenance", provenance}, {"created", created}};
}

Proposal proposal_from_json(const nlohmann::json& j, const std::string& where) {
  auto bad = [&](const std::string& what) { throw UserError(where + ": " + what); };
  if (!j.is_object()) bad("a proposal is a JSON object");
  Proposal p;
  p.kind = j.value("kind", std::string());
  if (p.kind != "lowering") bad("\"kind\" must be \"lowering\"");
  p.status = j.value("status", std::string("proposed"));
  if (p.status != "accepted" && p.status != "rejected" && p.status != "proposed") {
    bad("\"status\" must be accepted, rejected or proposed");
  }
  if (!j.contains("payload")) bad("no \"payload\"");
  // A rejected lowering is kept as it came (it may be what failed the checks); any other is
  // stored as discover will read it.
  if (p.status == "rejected") {
    p.payload = j["payload"];
  } else {
    p.payload = discover::check_lowering(j["payload"], where + ": payload");
  }
  p.key = j.value("key", p.payload.is_object() ? p.payload.value("op", std::string()) : std::string());
  if (p.key.empty() || p.key.size() > 64) bad("\"key\" must name the op");
  if (p.status != "rejected" && p.key != p.payload["op"].get<std::string>()) bad("\"key\" is not the payload's op");
  p.gates = j.value("gates", nlohmann::json::array());
  p.provenance = j.value("provenance", nlohmann::json::object());
  if (!p.gates.is_array() || !p.provenance.is_object()) bad("\"gates\" is a list and \"provenance\" an object");
  return p;
}

int64_t Registry::put_proposal(const Proposal& p) {
  exec(db_, path_, "BEGIN IMMEDIATE;");
  int64_t id = 0;
  try {
    Stmt q(db_, path_,
           "INSERT INTO proposals(kind, key, payload, status, gates, provenance) VALUES(?, ?, ?, ?, ?, ?) "
           "ON CONFLICT(kind, key, payload) DO UPDATE SET status = excluded.status, gates = excluded.gates, "
           "provenance = excluded.provenance");
    q.bind(1, p.kind);
    q.bind(2, p.key);
    q.bind(3, p.payload.dump());
    q.bind(4, p.status);
    q.bind(5, p.gates.dump());
    q.bind(6, p.provenance.dump());
    if (sqlite3_step(q.s) != SQLITE_DONE) fail(db_, path_, "cannot store the proposal");
    Stmt again(db_, path_, "SELECT id FROM proposals WHERE kind = ? AND key = ? AND payload = ?");
    again.bind(1, p.kind);
    again.bind(2, p.key);
    again.bind(3, p.payload.dump());
    if (sqlite3_step(again.s) != SQLITE_ROW) fail(db_, path_, "the stored proposal is gone");
    id = sqlite3_column_int64(again.s, 0);
  } catch (...) {
    sqlite3_exec(db_, "ROLLBACK;", nullptr, nullptr, nullptr);
    throw;
  }
  exec(db_, path_, "COMMIT;");
  return id;
}

std::vector<Proposal> Registry::proposals(const std::string& kind, const std::string& status) const {
  {
    Stmt t(db_, path_, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'proposals'");
    if (sqlite3_step(t.s) != SQLITE_ROW) return {};
  }
  Stmt q(db_, path_,
         "SELECT id, kind, key, payload, status, gates, provenance, created FROM proposals "
         "WHERE (?1 = '' OR kind = ?1) AND (?2 = '' OR status = ?2) ORDER BY id");
  q.bind(1, kind);
  q.bind(2, status);
  std::vector<Proposal> out;
  while (sqlite3_step(q.s) == SQLITE_ROW) {
    Proposal p;
    p.id = sqlite3_column_int64(q.s, 0);
    p.kind = q.text(1);
    p.key = q.text(2);
    p.payload = nlohmann::json::parse(q.text(3), nullptr, false);
    p.status = q.text(4);
    p.gates = nlohmann::json::parse(q.text(5), nullptr, false);
    p.provenance = nlohmann::json::parse(q.text(6), nullptr, false);
    p.created = q.text(7);
    out.push_back(std::move(p));
  }
  return out;
}

bool Registry::set_proposal_status(int64_t id, const std::string& status) {
  if (status != "accepted" && status != "rejected" && status != "proposed") {
    throw UserError("a proposal's status is accepted, rejected or proposed, not '" + status + "'");
  }
  Stmt q(db_, path_, "UPDATE proposals SET status = ? WHERE id = ?");
  q.bind(1, status);
  sqlite3_bind_int64(q.s, 2, id);
  if (sqlite3_step(q.s) != SQLITE_DONE) fail(db_, path_, "cannot update the proposal");
  return sqlite3_changes(db_) > 0;
}

}  // namespace fact::registry
