// The `strata` sub-commands. Each registers its options on the CLI11 app and returns the
// action to run once parsing succeeded; actions throw std::exception on failure.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>

namespace strata::cli {

using Action = std::function<int()>;

void add_run_command(CLI::App& app, Action& action);
void add_bench_command(CLI::App& app, Action& action);
void add_gguf_commands(CLI::App& app, Action& action);
void add_serve_command(CLI::App& app, Action& action);
void add_cluster_command(CLI::App& app, Action& action);
void add_drain_command(CLI::App& app, Action& action);
void add_pull_command(CLI::App& app, Action& action);

// Memory read bandwidth with `threads` threads, in bytes per second, over 256 MiB passes, each
// read both plainly and with software prefetches (the faster way's median counts). The
// median pass is what a long read sustains (on shared VMs the best one has read up to 1.7x
// it, a short burst). A shared VM's bandwidth also changes over time, so a benchmark
// measures it right around what it compares with it.
class BandwidthProbe {
 public:
  explicit BandwidthProbe(int threads);  // allocates and fills the 256 MiB buffer
  ~BandwidthProbe();
  double median_of(int passes);  // passes >= 1

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace strata::cli
