// The pattern registry: one SQLite file (WAL) of measured kernel configurations.
//
// Rows are keyed by a pattern signature (family, epilogue, dtypes, layouts), the arch and the
// problem sizes. Retrieval is exact first, then nearest problem size (log-distance over the
// sizes both share), passed rows only. The schema is versioned in the `meta` table; a file of
// another version is refused by name rather than misread. Stage 1 only reads it; stage 2 writes.
//
// Rows travel between machines as an export document (`fact-engine registry export`):
//
//   {"fact_registry_export": 1, "schema_version": 2,
//    "produced_by": {"host": ..., "command": ..., "registry": ..., "date": ...},
//    "rows": [{"id", "signature", "arch", "problem", "config", "time_us", "error",
//              "disposition", "provenance", "created", "knobs"}, ...]}
//
// Schema 2 added `knobs` (the launch knobs a row was timed with; {} when unknown). A schema 1
// file is migrated when opened for writing and read as knobs {} when opened read-only.
//
// Import validates every row first and writes them in one transaction (all or nothing); a row
// whose (signature, arch, problem, config) is already stored replaces the stored measurement
// when it was measured later, and is skipped otherwise, so importing the same file twice is
// harmless. "id" is informational: the importing file numbers its own rows.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "discover/pattern.h"

struct sqlite3;

namespace fact::registry {

inline constexpr int kSchemaVersion = 2;  // 2: rows keep the launch knobs
inline constexpr int kExportFormatVersion = 1;

// "gemm[bias+gelu_tanh]:bf16,bf16->bf16:row,col"
std::string signature(const discover::Match& m);

struct Row {
  std::string signature;
  std::string arch;
  nlohmann::json problem;
  nlohmann::json config;
  double time_us = 0;
  double error = 0;
  std::string disposition = "passed";  // passed | incorrect | fault | compile_error | not_supported
  std::string provenance = "seed";     // seed | tuned | agent
  nlohmann::json knobs = nlohmann::json::object();  // run-time launch knobs it was timed with
};

// A stored row with its registry-local id and creation time (UTC, "YYYY-MM-DD HH:MM:SS").
struct Entry {
  int64_t id = 0;
  std::string created;
  Row row;
  nlohmann::json to_json() const;  // one row of the export format
};

// Which rows `list` returns; empty fields match everything.
struct ListFilter {
  std::string signature;    // substring of the signature ("gemm[bias" matches all biased GEMMs)
  std::string arch;         // exact
  std::string disposition;  // exact
  std::string provenance;   // exact
  size_t limit = 0;         // 0: all
};

struct ImportStats {
  size_t rows = 0;      // rows in the document
  size_t inserted = 0;  // new rows written
  size_t updated = 0;   // present by (signature, arch, problem, config), measured later now
  size_t skipped = 0;   // present, and the stored measurement is as new or newer
};

// A row of an export document, checked: UserError naming `where` ("FILE: row 3") otherwise.
Row row_from_json(const nlohmann::json& j, const std::string& where);
// Checks a whole export document (header and every row) without touching any registry;
// UserError naming `source` otherwise. import_json does the same before it writes.
void check_export(const nlohmann::json& doc, const std::string& source);

// What the agent proposed (fact.agent), with what FACT's gates made of it. Kind "lowering":
// key is the ATen op, payload a lowering (discover/lowering.h). Status: accepted (passed the
// gates; discover uses it), rejected (failed one, or vetoed by a person), proposed.
struct Proposal {
  int64_t id = 0;
  std::string kind;
  std::string key;
  nlohmann::json payload;
  std::string status;
  nlohmann::json gates = nlohmann::json::array();       // [{"gate", "passed", "why"}, ...]
  nlohmann::json provenance = nlohmann::json::object();  // model, endpoint host, prompt digest, ...
  std::string created;
  nlohmann::json to_json() const;
};

// A proposal document (`fact-engine registry propose FILE`), checked: UserError naming
// `where` otherwise. A lowering's payload is checked as discover will read it.
Proposal proposal_from_json(const nlohmann::json& j, const std::string& where);

struct Hit {
  Row row;
  std::string match;  // exact | nearest
  double distance = 0;
};

class Registry {
 public:
  // Open an existing registry read-only; nullopt if the file does not exist.
  static std::optional<Registry> open_readonly(const std::string& path);
  // Open or create for writing (stage 2, tests).
  static Registry open_writable(const std::string& path);
  // $FACT_REGISTRY, else $XDG_CACHE_HOME/fact/registry.db, else ~/.cache/fact/registry.db.
  static std::string default_path();

  Registry(Registry&&) noexcept;
  Registry& operator=(Registry&&) noexcept;
  ~Registry();

  void insert(const Row& row);  // one transaction: all or nothing
  std::vector<Hit> lookup(const std::string& signature, const std::string& arch,
                          const nlohmann::json& problem, size_t limit = 3) const;
  int64_t count() const;
  const std::string& path() const { return path_; }

  // Every row (any disposition) matching the filter, in id order.
  std::vector<Entry> list(const ListFilter& filter = {}) const;
  // One row by id; nullopt if there is none.
  std::optional<Entry> get(int64_t id) const;
  // Every row that can still be read, one at a time by id (a damaged page costs only its rows),
  // and how many could not be: `fact-engine registry salvage`.
  std::vector<Entry> salvage(int64_t& unreadable) const;
  // Delete one row; false when there is none with that id.
  bool remove(int64_t id);
  // The whole registry as an export document; `produced_by` becomes its header.
  nlohmann::json export_json(const nlohmann::json& produced_by = nlohmann::json::object()) const;
  // Import an export document in one transaction: every row is validated before any is written,
  // and any failure leaves the registry as it was. `source` names the document in errors.
  ImportStats import_json(const nlohmann::json& doc, const std::string& source = "import");

  // Store a proposal; the same (kind, key, payload) again updates its status, gates and
  // provenance. Returns its id.
  int64_t put_proposal(const Proposal& p);
  // Proposals of a kind and status ("" matches all), in id order; none in a registry made
  // before proposals existed.
  std::vector<Proposal> proposals(const std::string& kind = "", const std::string& status = "") const;
  // False when there is no proposal with that id.
  bool set_proposal_status(int64_t id, const std::string& status);

 private:
  Registry(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  std::string knobs_sql() const;  // the knobs column, or '{}' when reading a schema 1 file
  std::string columns() const;  // the Entry columns, knobs last
  void check_schema(bool create);
  sqlite3* db_ = nullptr;
  std::string path_;
  bool knobs_column_ = true;
};

}  // namespace fact::registry
