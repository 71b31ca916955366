#include "hub/progress.h"

#include <unistd.h>

#include <algorithm>

#include "units/byte_size.h"

namespace strata::hub {

namespace {

constexpr auto kRedraw = std::chrono::milliseconds(100);
constexpr auto kLogEvery = std::chrono::seconds(30);

std::string format(const char* pattern, auto... args) {
  char buffer[256];
  std::snprintf(buffer, sizeof buffer, pattern, args...);
  return buffer;
}

std::string duration(double seconds) {
  const long s = static_cast<long>(seconds + 0.5);
  if (s >= 3600) return format("%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  return format("%ld:%02ld", s / 60, s % 60);
}

}  // namespace

Progress::Progress(std::FILE* out, std::string name, uint64_t total)
    : out_(out), name_(std::move(name)), total_(total), terminal_(out != nullptr && ::isatty(::fileno(out)) != 0) {}

void Progress::start(uint64_t have) {
  started_ = true;
  start_bytes_ = have;
  start_time_ = last_print_ = Clock::now();
  last_tenth_ = total_ == 0 ? 10 : have * 10 / total_;
}

std::string Progress::line(uint64_t have, bool for_terminal) const {
  const double seconds = std::chrono::duration<double>(Clock::now() - start_time_).count();
  const double moved = static_cast<double>(have - std::min(have, start_bytes_));
  const double rate = seconds > 0 ? moved / seconds : 0;
  const double fraction = total_ == 0 ? 1.0 : std::min(1.0, static_cast<double>(have) / static_cast<double>(total_));
  const std::string eta = rate > 0 ? duration(static_cast<double>(total_ - std::min(have, total_)) / rate) : "?";
  const std::string sizes = units::describe_bytes(have) + (for_terminal ? " / " : " of ") +
                            units::describe_bytes(total_);
  if (!for_terminal) {
    return format("strata: %s: %s (%.0f%%), %s/s, ETA %s", name_.c_str(), sizes.c_str(), fraction * 100,
                  units::describe_bytes(static_cast<uint64_t>(rate)).c_str(), eta.c_str());
  }
  constexpr int kWidth = 24;
  const int filled = static_cast<int>(fraction * kWidth);
  const std::string bar = std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(kWidth - filled), '-');
  // Trailing spaces wipe what a longer previous line left behind.
  return format("\r%s [%s] %3.0f%%  %s  %s/s  ETA %s    ", name_.c_str(), bar.c_str(), fraction * 100, sizes.c_str(),
                units::describe_bytes(static_cast<uint64_t>(rate)).c_str(), eta.c_str());
}

void Progress::update(uint64_t have) {
  if (out_ == nullptr || !started_) return;
  const Clock::time_point now = Clock::now();
  if (terminal_) {
    if (now - last_print_ < kRedraw) return;
    std::fputs(line(have, true).c_str(), out_);
    bar_drawn_ = true;
  } else {
    const uint64_t tenth = total_ == 0 ? 10 : have * 10 / total_;
    if (tenth <= last_tenth_ && now - last_print_ < kLogEvery) return;
    last_tenth_ = tenth;
    std::fprintf(out_, "%s\n", line(have, false).c_str());
  }
  last_print_ = now;
  std::fflush(out_);
}

void Progress::finish(uint64_t have) {
  if (out_ == nullptr || !started_) return;
  if (terminal_) {
    std::fprintf(out_, "%s\n", line(have, true).c_str());
  } else if (have * 10 / std::max<uint64_t>(total_, 1) > last_tenth_) {
    std::fprintf(out_, "%s\n", line(have, false).c_str());
  }
  bar_drawn_ = false;
  std::fflush(out_);
}

void Progress::break_line() {
  if (out_ == nullptr || !bar_drawn_) return;
  std::fputc('\n', out_);
  bar_drawn_ = false;
}

}  // namespace strata::hub
