// The `strata` sub-commands. Each registers its options on the CLI11 app and returns the
// action to run once parsing succeeded; actions throw std::exception on failure.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace strata::cli {

using Action = std::function<int()>;

void add_run_command(CLI::App& app, Action& action);
void add_bench_command(CLI::App& app, Action& action);
void add_gguf_commands(CLI::App& app, Action& action);
void add_serve_command(CLI::App& app, Action& action);

// Memory read bandwidth with `threads` threads, in bytes per second, over several 1 GiB
// passes: the median is what a long read sustains; the best pass can be a short burst
// (on shared VMs it has read up to 1.7x the median).
struct ReadBandwidth {
  double median;
  double best;
};
ReadBandwidth measure_read_bandwidth(int threads);

}  // namespace strata::cli
