#include "cli/registry_cmd.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <ostream>
#include <sstream>

#include "ir/error.h"
#include "util/files.h"

namespace fact::cli {

using nlohmann::json;

namespace {

std::string resolve(const RegistryCommand& cmd) {
  return cmd.registry_path.empty() ? registry::Registry::default_path() : cmd.registry_path;
}

// list, show and export read: a missing file is most likely a wrong path, so say so rather than
// print an empty registry.
registry::Registry open_existing(const std::string& path) {
  auto reg = registry::Registry::open_readonly(path);
  if (!reg) {
    throw UserError("registry " + path + " does not exist (rows arrive with tuning runs or "
                    "`fact-engine registry import FILE`)");
  }
  return std::move(*reg);
}

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::ostringstream s;
  s << std::put_time(&tm, "%Y-%m-%dT%H:%M:%SZ");
  return s.str();
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

// "m=4096 n=3072 k=768": the usual sizes first, batch only when it is not 1.
std::string problem_text(const json& p) {
  if (!p.is_object()) return p.dump();
  std::string s;
  auto add = [&](const std::string& k, const json& v) {
    std::string text;
    if (v.is_array()) {
      for (size_t i = 0; i < v.size(); ++i) text += (i ? "+" : "") + v[i].dump();
    } else {
      text = v.is_string() ? v.get<std::string>() : v.dump();
    }
    s += (s.empty() ? "" : " ") + k + "=" + text;
  };
  static const char* first[] = {"batch", "m", "n", "k"};
  for (const char* k : first) {
    if (!p.contains(k)) continue;
    if (std::string(k) == "batch" && p[k] == 1) continue;
    add(k, p[k]);
  }
  for (const auto& [k, v] : p.items()) {
    if (std::find(std::begin(first), std::end(first), k) == std::end(first)) add(k, v);
  }
  return s;
}

std::string config_text(const json& c) {
  if (c.is_object() && c.contains("name") && c["name"].is_string()) return c["name"].get<std::string>();
  return c.dump();
}

std::string time_text(double us) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(us < 100 ? 2 : 1) << us;
  return s.str();
}


}  // namespace

json read_json_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw UserError(path + ": no such file");
  if (std::filesystem::is_directory(path, ec)) throw UserError(path + ": is a directory, not a JSON file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError(path + ": cannot read");
  try {
    return json::parse(f);
  } catch (const json::parse_error& e) {
    throw UserError(path + ": not valid JSON: " + e.what());
  }
}

void print_registry_table(const std::vector<registry::Entry>& entries, std::ostream& out) {
  const std::vector<std::string> head = {"id",      "signature", "arch",        "problem",   "config",
                                         "time_us", "error",     "disposition", "provenance", "created"};
  std::vector<std::vector<std::string>> rows;
  for (const auto& e : entries) {
    std::ostringstream err;
    err << std::setprecision(2) << e.row.error;
    rows.push_back({std::to_string(e.id), e.row.signature, e.row.arch, problem_text(e.row.problem),
                    config_text(e.row.config),
                    // Rows that never ran (compile errors, faults) have no time worth printing.
                    e.row.disposition != "passed" && e.row.time_us == 0 ? "-" : time_text(e.row.time_us),
                    err.str(), e.row.disposition,
                    e.row.provenance, e.created});
  }
  std::vector<size_t> width(head.size());
  for (size_t i = 0; i < head.size(); ++i) width[i] = head[i].size();
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  // Numbers right-aligned (id, time, error), text left-aligned.
  auto line = [&](const std::vector<std::string>& r) {
    std::string s;
    for (size_t i = 0; i < r.size(); ++i) {
      const bool right = i == 0 || i == 5 || i == 6;
      const std::string pad(width[i] - r[i].size(), ' ');
      s += (i ? "  " : "") + (right ? pad + r[i] : (i + 1 == r.size() ? r[i] : r[i] + pad));
    }
    out << s << "\n";
  };
  line(head);
  for (const auto& r : rows) line(r);
}

int run_registry_command(const RegistryCommand& cmd, std::ostream& out) {
  const std::string path = resolve(cmd);
  if (cmd.action == "list") {
    const auto reg = open_existing(path);
    const auto entries = reg.list(cmd.filter);
    if (entries.empty()) {
      out << "registry " << path << ": no rows" << (reg.count() ? " match" : "") << "\n";
      return 0;
    }
    print_registry_table(entries, out);
    out << entries.size() << " of " << reg.count() << " rows (" << path << ")\n";
    return 0;
  }
  if (cmd.action == "show") {
    const auto reg = open_existing(path);
    const auto e = reg.get(cmd.id);
    if (!e) {
      throw UserError("registry " + path + ": no row with id " + std::to_string(cmd.id) +
                      " (see `fact-engine registry list`)");
    }
    out << e->to_json().dump(2) << "\n";
    return 0;
  }
  if (cmd.action == "export") {
    const auto reg = open_existing(path);
    const json doc = reg.export_json({{"host", host_name()},
                                      {"command", "fact-engine registry export"},
                                      {"registry", path},
                                      {"date", utc_now()}});
    if (cmd.output.empty() || cmd.output == "-") {
      out << doc.dump(2) << "\n";
    } else {
      write_text_file(cmd.output, doc.dump(2) + "\n");
      out << cmd.output << ": " << doc["rows"].size() << " rows exported from " << path << "\n";
    }
    return 0;
  }
  if (cmd.action == "measured") {
    // What tuning asks before it measures: per built kernel of a run, the registry's fastest
    // passed row for what it computes (manifest "measures") at that problem, arch and config.
    const auto reg = open_existing(path);
    const std::filesystem::path run(cmd.file);
    auto read_run_file = [&](const char* name) {
      try {
        return read_json_file((run / name).string());
      } catch (const UserError& e) {
        throw UserError(std::string("cannot read ") + e.what() + "; run `fact realize` again into a fresh --out");
      }
    };
    const json plan = read_run_file("plan.json");
    const json manifest = read_run_file("manifest.json");
    const std::string arch = plan.value("arch", "sm90");
    json kernels = json::array();
    for (size_t i = 0; i < manifest.size(); ++i) {
      const json& e = manifest[i];
      if (!e.is_object() || !e.contains("library")) continue;
      if (!e.contains("measures")) {
        throw UserError((run / "manifest.json").string() + ": kernel " + e.value("kernel", std::string("?")) +
                        " has no \"measures\" (an older fact realize wrote it): run fact realize again");
      }
      const json& m = e["measures"];
      const std::string name = e.value("config", json::object()).value("name", std::string());
      json best = nullptr;
      // Exact problems first, fastest first (lookup's order): the first with this config and a
      // time is it; a row without a time (0) only where no other is.
      for (const auto& h : reg.lookup(m.at("signature"), arch, m.at("problem"), SIZE_MAX)) {
        if (h.match != "exact") break;
        if (!h.row.config.is_object() || h.row.config.value("name", std::string()) != name) continue;
        if (!best.is_null() && h.row.time_us <= 0) continue;
        best = {{"time_us", h.row.time_us}, {"error", h.row.error}, {"knobs", h.row.knobs},
                {"config", h.row.config}, {"provenance", h.row.provenance}};
        if (h.row.time_us > 0) break;
      }
      kernels.push_back({{"manifest_index", i},
                         {"pattern_index", e.value("pattern_index", -1)},
                         {"kernel", e.value("kernel", std::string())},
                         {"row", best}});
    }
    out << json({{"registry", path}, {"arch", arch}, {"kernels", kernels}}).dump(2) << "\n";
    return 0;
  }
  if (cmd.action == "import") {
    // Read and check the whole document before opening the registry: a bad file must not even
    // create one.
    const json doc = read_json_file(cmd.file);
    registry::check_export(doc, cmd.file);
    auto reg = registry::Registry::open_writable(path);
    const auto stats = reg.import_json(doc, cmd.file);
    out << cmd.file << ": " << stats.rows << " rows, " << stats.inserted << " imported, " << stats.updated
        << " updated (measured later), " << stats.skipped << " already present (registry " << path << " now has "
        << reg.count() << " rows)\n";
    return 0;
  }
  if (cmd.action == "salvage") {
    // Read row by row from a damaged file: what can be read goes to an export document, to
    // import into a new registry.
    if (!std::filesystem::exists(path)) throw UserError("registry " + path + " does not exist");
    std::optional<registry::Registry> reg;
    try {
      reg = registry::Registry::open_readonly(path);
    } catch (const std::exception& e) {
      throw UserError("registry " + path + " cannot be opened at all (" + e.what() +
                      "); nothing to salvage: move it away and let tuning start a new one");
    }
    int64_t unreadable = 0;
    json rows = json::array();
    for (const auto& e : reg->salvage(unreadable)) rows.push_back(e.to_json());
    const json doc = {{"fact_registry_export", registry::kExportFormatVersion},
                      {"schema_version", registry::kSchemaVersion},
                      {"produced_by", {{"host", host_name()}, {"command", "fact-engine registry salvage"},
                                       {"registry", path}, {"date", utc_now()}}},
                      {"rows", rows}};
    if (cmd.output.empty() || cmd.output == "-") {
      out << doc.dump(2) << "\n";
    } else {
      write_text_file(cmd.output, doc.dump(2) + "\n");
      out << cmd.output << ": " << rows.size() << " rows salvaged from " << path << ", " << unreadable
          << " unreadable; import them into a new registry with `fact registry --registry NEW import "
          << cmd.output << "`\n";
    }
    return 0;
  }
  if (cmd.action == "delete") {
    auto reg = registry::Registry::open_writable(path);
    if (!reg.remove(cmd.id)) {
      throw UserError("registry " + path + ": no row with id " + std::to_string(cmd.id) +
                      " (see `fact-engine registry list`)");
    }
    out << "registry " << path << ": row " << cmd.id << " deleted (" << reg.count() << " rows left)\n";
    return 0;
  }
  if (cmd.action == "proposals") {
    const auto reg = registry::Registry::open_readonly(path);
    json list = json::array();
    if (reg) {
      for (const auto& p : reg->proposals(cmd.kind, cmd.status)) list.push_back(p.to_json());
    }
    out << list.dump(1) << "\n";
    return 0;
  }
  if (cmd.action == "propose") {
    json doc;
    if (cmd.file == "-") {
      doc = json::parse(std::cin, nullptr, false);
      if (doc.is_discarded()) throw UserError("stdin: not JSON");
    } else {
      doc = read_json_file(cmd.file);
    }
    const auto p = registry::proposal_from_json(doc, cmd.file == "-" ? "stdin" : cmd.file);
    auto reg = registry::Registry::open_writable(path);
    out << json{{"id", reg.put_proposal(p)}, {"status", p.status}}.dump() << "\n";
    return 0;
  }
  if (cmd.action == "proposal-status") {
    auto reg = registry::Registry::open_writable(path);
    if (!reg.set_proposal_status(cmd.id, cmd.status)) {
      throw UserError("registry " + path + ": no proposal with id " + std::to_string(cmd.id) +
                      " (see `fact agent list`)");
    }
    out << "registry " << path << ": proposal " << cmd.id << " " << cmd.status << "\n";
    return 0;
  }
  throw InternalError("registry command: unknown action '" + cmd.action + "'");
}

}  // namespace fact::cli
