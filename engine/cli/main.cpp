// fact-engine: the C++ engine's command line. The Python `fact` CLI traces modules and calls
// this; it can also be used directly on a graph JSON.
//
// Exit status: 0 ok, 2 a user error (message on stderr), 3 an internal error (a bug).
#include <CLI/CLI.hpp>
#include <iostream>

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
    cmd->add_flag("--json", json_out, "machine-readable output");
  };
  auto* discover = app.add_subcommand("discover", "rank the fusion patterns of a graph");
  add_common(discover);
  auto* explain = app.add_subcommand("explain", "why a node is, or is not, covered by a pattern");
  add_common(explain);
  explain->add_option("--node", node, "node name, as in `fact-engine print`")->required();
  auto* validate = app.add_subcommand("validate", "load and validate a graph");
  validate->add_option("graph", opt.graph_path)->required();
  auto* print = app.add_subcommand("print", "print a graph, one node a line");
  print->add_option("graph", opt.graph_path)->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
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
