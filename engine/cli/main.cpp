// fact-engine: the C++ engine's command line. The Python `fact` CLI traces modules and calls
// this; it can also be used directly on a graph JSON.
//
// Exit status: 0 ok, 2 a user error (message on stderr), 3 an internal error (a bug).
#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/registry_cmd.h"
#include "realize/compile.h"
#include "discover/explain.h"
#include "ir/error.h"
#include "ir/json_io.h"
#include "ir/print.h"
#include "pipeline.h"
#include "report.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"FACT engine: discover fusion patterns in a traced PyTorch graph"};
  app.require_subcommand(1);
  fact::DiscoverOptions opt;
  bool json_out = false;
  std::string node;

  auto add_common = [&](CLI::App* cmd) {
    cmd->add_option("graph", opt.graph_path, "FACT graph JSON (from `fact trace`)")->required();
    cmd->add_option("--arch", opt.arch, "cost-model target")->check(CLI::IsMember({"sm90", "sm80"}));
    cmd->add_option("--gpu", opt.gpu, "GPU within the arch (h200, h100, a100)");
    cmd->add_option("--registry", opt.registry_path, "pattern registry (SQLite)");
    cmd->add_option("--lowerings", opt.lowerings_path, "JSON list of lowerings to use besides the registry's accepted ones");
    cmd->add_flag("--json", json_out, "machine-readable output");
  };
  auto* discover = app.add_subcommand("discover", "rank the fusion patterns of a graph");
  add_common(discover);
  auto* explain = app.add_subcommand("explain", "why a node is, or is not, covered by a pattern");
  add_common(explain);
  explain->add_option("--node", node, "node name, as in `fact-engine print`")->required();
  fact::RealizeOptions ropt;
  auto* realize = app.add_subcommand("realize", "emit and compile CUTLASS kernels for a graph's plan (no GPU)");
  realize->add_option("graph", ropt.discover.graph_path, "FACT graph JSON")->required();
  realize->add_option("--out", ropt.run_dir, "run directory (sources, logs, manifest)")->required();
  realize->add_option("--arch", ropt.discover.arch, "target")->check(CLI::IsMember({"sm90"}));
  realize->add_option("--registry", ropt.discover.registry_path, "pattern registry (SQLite)");
  realize->add_option("--lowerings", ropt.discover.lowerings_path, "JSON list of lowerings besides the registry's accepted ones");
  realize->add_option("--candidates", ropt.candidates, "configs compiled per pattern")->check(CLI::Range(1, 1 << 20).description("at least 1"));
  realize->add_option("--configs", ropt.configs,
                      "compile exactly these configs (names as in candidates/pattern-N.json) for every GEMM or "
                      "attention pattern of their family they fit, instead of the ranked top N")
      ->delimiter(',');
  realize->add_option("--cutlass-dir", ropt.cutlass_dir, "CUTLASS source tree (default: $CUTLASS_DIR)");
  realize->add_option("--nvcc", ropt.nvcc, "nvcc to use");
  realize->add_option("--cache-dir", ropt.cache_dir, "kernel cache (default: ~/.cache/fact/kernels)");
  realize->add_option("--jobs", ropt.jobs, "parallel compiles (default: every kernel at once up to 1.5x the cores, else one a core)");
  realize->add_option("--compile-timeout", ropt.compile_timeout_s,
                      "seconds one compile may take before it is stopped (default: $FACT_COMPILE_TIMEOUT, else 1800; 0: none)")
      ->check(CLI::NonNegativeNumber);
  realize->add_flag("--quiet", ropt.quiet, "no progress lines");
  realize->add_flag("--json", json_out, "print the manifest as JSON");
  auto* cache = app.add_subcommand("cache", "check or clean the kernel cache");
  std::string cache_dir;
  cache->add_option("--cache-dir", cache_dir, "kernel cache (default: $FACT_CACHE_DIR, else ~/.cache/fact/kernels)");
  auto* cache_verify = cache->add_subcommand("verify", "check every cached kernel against the digest it was built with");
  auto* cache_clean = cache->add_subcommand("clean", "remove damaged kernels, failed builds' folders and abandoned builds");
  cache->require_subcommand(1);
  auto* validate = app.add_subcommand("validate", "load and validate a graph");
  validate->add_option("graph", opt.graph_path)->required();
  auto* print = app.add_subcommand("print", "print a graph, one node a line");
  print->add_option("graph", opt.graph_path)->required();
  fact::cli::RegistryCommand registry_cmd;
  auto* registry = fact::cli::add_registry_command(app, registry_cmd);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  if (*registry) return fact::cli::run_registry_command(registry_cmd, std::cout);
  if (*cache) {
    const auto report = fact::realize::check_cache(cache_dir, cache_clean->parsed());
    std::cout << report.text;
    return cache_verify->parsed() && report.damaged > 0 ? 1 : 0;
  }
  if (*validate) {
    const auto g = fact::ir::load_graph_file(opt.graph_path);
    std::cout << opt.graph_path << ": ok, " << g.size() << " nodes\n";
    return 0;
  }
  if (*print) {
    fact::ir::print_graph(fact::ir::load_graph_file(opt.graph_path), std::cout);
    return 0;
  }
  if (*realize) {
    const auto r = fact::run_realize(ropt);
    if (json_out) {
      std::cout << r.manifest.dump(2) << "\n";
    } else {
      std::cout << "realized into " << ropt.run_dir << ": " << r.compiled << " compiled, " << r.cached
                << " from the cache, " << r.failed << " failed, " << r.not_supported << " not supported\n";
      for (const auto& e : r.manifest) {
        std::cout << "  #" << e["pattern_index"] << " " << e["family"].get<std::string>() << "  "
                  << e.value("kernel", std::string("-")) << "  " << e["status"].get<std::string>();
        if (e.contains("detail")) std::cout << ": " << e["detail"].get<std::string>();
        std::cout << "\n";
      }
    }
    if (r.compiled + r.cached == 0 && r.failed > 0) {
      // Failed compiles are results (status compile_error in the manifest, each with its log),
      // but a realize that built nothing at all has failed.
      std::cerr << "error: no kernel was built: all " << r.failed
                << " compiles failed (the manifest's detail names each one's log; "
                << ropt.run_dir << "/manifest.json)\n";
      return 1;
    }
    return 0;
  }
  const auto result = fact::run_discover(opt);
  if (*discover) {
    if (json_out) {
      std::cout << result.plan.dump(2) << "\n";
    } else {
      fact::print_plan(result.plan, std::cout);
    }
    return 0;
  }
  const auto id = result.graph.find(node);
  if (!id) {
    throw fact::UserError(opt.graph_path + ": no node named '" + node +
                          "' (list the names with `fact-engine print " + opt.graph_path + "`)");
  }
  const auto e = fact::discover::explain(result.graph, result.discovery, *id);
  if (json_out) {
    std::cout << e.dump(2) << "\n";
  } else {
    fact::print_explain(e, std::cout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const fact::UserError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "internal error (please report): " << e.what() << "\n";
    return 3;
  }
}
