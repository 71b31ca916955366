#include <cstdio>
#include <exception>

#include "api/model_facts.h"
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"Strata: one LLM endpoint from the machines you have"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "strata " + std::string(strata::api::kVersion));
  strata::cli::Action action;
  strata::cli::add_serve_command(app, action);
  strata::cli::add_cluster_command(app, action);
  strata::cli::add_drain_command(app, action);
  strata::cli::add_run_command(app, action);
  strata::cli::add_bench_command(app, action);
  strata::cli::add_gguf_commands(app, action);
  strata::cli::add_pull_command(app, action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return action();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "strata: error: %s\n", e.what());
    return 1;
  }
}
