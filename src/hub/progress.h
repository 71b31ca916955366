// A download's progress: a bar redrawn in place on a terminal, or plain lines a log can keep
// (every tenth of the file, and at least every 30 s) when the stream is not one.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace strata::hub {

class Progress {
 public:
  // `out` may be null: nothing is printed.
  Progress(std::FILE* out, std::string name, uint64_t total);
  // Bytes at hand when a transfer starts (again): the rate counts only what comes after.
  void start(uint64_t have);
  void update(uint64_t have);
  // Ends the bar's line; says how much came how fast.
  void finish(uint64_t have);
  // Ends a half-drawn bar's line, so that a message can follow on its own.
  void break_line();

 private:
  using Clock = std::chrono::steady_clock;
  std::string line(uint64_t have, bool for_terminal) const;

  std::FILE* out_;
  std::string name_;
  uint64_t total_;
  bool terminal_;
  bool started_ = false;
  uint64_t start_bytes_ = 0;
  Clock::time_point start_time_;
  Clock::time_point last_print_;
  uint64_t last_tenth_ = 0;
  bool bar_drawn_ = false;
};

}  // namespace strata::hub
