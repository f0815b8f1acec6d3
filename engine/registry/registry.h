// The pattern registry: one SQLite file (WAL) of measured kernel configurations.
//
// Rows are keyed by a pattern signature (family, epilogue, dtypes, layouts), the arch and the
// problem sizes. Retrieval is exact first, then nearest problem size (log-distance over the
// sizes both share), passed rows only. The schema is versioned in the `meta` table; a file of
// another version is refused by name rather than misread. Stage 1 only reads it; stage 2 writes.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "discover/pattern.h"

struct sqlite3;

namespace fact::registry {

inline constexpr int kSchemaVersion = 1;

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
};

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

 private:
  Registry(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  void check_schema(bool create);
  sqlite3* db_ = nullptr;
  std::string path_;
};

}  // namespace fact::registry
