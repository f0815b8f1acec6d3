// `fact-engine registry list|show ID|export [-o FILE]|import FILE|measured RUN [--registry PATH]`:
// look into the pattern registry, move its rows between machines (export on the GPU box that
// tuned them, import elsewhere), and answer tuning's one question (measured: which kernels of a
// realize run it has timed). The document format is described in registry/registry.h.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "registry/registry.h"

namespace fact::cli {

struct RegistryCommand {
  std::string action;           // list | show | export | import | salvage | delete | measured | ...
  std::string registry_path;    // --registry; empty: Registry::default_path()
  int64_t id = 0;               // show ID
  std::string file;             // import FILE; measured RUN_DIR
  std::string output;           // export -o FILE; empty: stdout
  registry::ListFilter filter;  // list --signature --arch --disposition --provenance --limit
  std::string kind, status;     // proposals --kind --status; proposal-status ID STATUS
};

// Runs one action, printing to `out`; returns the exit status (0). UserError for a registry file
// that does not exist (list, show, export), an unknown id, or an import file that is missing, not
// JSON or not an export document: the message names the file. A failed import changes nothing.
int run_registry_command(const RegistryCommand& cmd, std::ostream& out);

// Reads and parses a JSON file; UserError naming the file when it is missing or malformed.
nlohmann::json read_json_file(const std::string& path);

// The readable table of `registry list`.
void print_registry_table(const std::vector<registry::Entry>& entries, std::ostream& out);

// Declares `registry` and its four actions on a CLI11 app; parsed values land in `cmd` (which
// must outlive the parse). A template so that neither this header nor the engine library needs
// CLI11: main.cpp, which includes it, instantiates it with CLI::App. Returns the `registry`
// subcommand, true after parsing when it was given.
template <class App>
App* add_registry_command(App& app, RegistryCommand& cmd) {
  const char* registry_help = "pattern registry (SQLite); default $FACT_REGISTRY, else ~/.cache/fact/registry.db";
  App* reg = app.add_subcommand("registry", "list, show, export or import rows of the pattern registry");
  reg->require_subcommand(1);
  reg->add_option("--registry", cmd.registry_path, registry_help);
  auto action = [&cmd, registry_help](App* sub, const char* name) {
    sub->add_option("--registry", cmd.registry_path, registry_help);
    sub->callback([&cmd, name] { cmd.action = name; });
    return sub;
  };
  App* list = action(reg->add_subcommand("list", "the rows as a table"), "list");
  list->add_option("--signature", cmd.filter.signature, "rows whose signature contains this text");
  list->add_option("--arch", cmd.filter.arch, "rows for this arch (sm90, sm80)");
  list->add_option("--disposition", cmd.filter.disposition, "passed, incorrect, fault, compile_error, not_supported");
  list->add_option("--provenance", cmd.filter.provenance, "seed, tuned, agent");
  list->add_option("--limit", cmd.filter.limit, "at most this many rows");
  App* show = action(reg->add_subcommand("show", "one row as JSON"), "show");
  show->add_option("id", cmd.id, "row id, as `registry list` prints it")->required();
  App* exp = action(reg->add_subcommand("export", "every row as an export document (JSON)"), "export");
  exp->add_option("-o,--output", cmd.output, "write to FILE instead of stdout");
  App* salvage = action(reg->add_subcommand("salvage", "the rows a damaged registry can still give, as an export document"),
                        "salvage");
  salvage->add_option("-o,--output", cmd.output, "write to FILE instead of stdout");
  App* del = action(reg->add_subcommand("delete", "delete one row"), "delete");
  del->add_option("id", cmd.id, "row id, as `registry list` prints it")->required();
  App* measured = action(reg->add_subcommand("measured", "the fastest passed row of each kernel a `realize` run built (JSON)"),
                         "measured");
  measured->add_option("run", cmd.file, "run directory of `fact-engine realize` (its plan.json and manifest.json)")
      ->required();
  App* imp = action(reg->add_subcommand("import", "add an export document's rows (all or nothing; duplicates skipped)"),
                    "import");
  imp->add_option("file", cmd.file, "export document (JSON)")->required();
  App* props = action(reg->add_subcommand("proposals", "the agent's proposals as JSON (fact agent list)"), "proposals");
  props->add_option("--kind", cmd.kind, "lowering");
  props->add_option("--status", cmd.status, "accepted, rejected or proposed");
  App* propose = action(reg->add_subcommand("propose", "store a proposal document (JSON), checked"), "propose");
  propose->add_option("file", cmd.file, "proposal document (JSON; - for stdin)")->required();
  App* pstatus = action(reg->add_subcommand("proposal-status", "set a proposal's status"), "proposal-status");
  pstatus->add_option("id", cmd.id, "proposal id, as `registry proposals` prints it")->required();
  pstatus->add_option("status", cmd.status, "accepted, rejected or proposed")->required();
  return reg;
}

}  // namespace fact::cli
