#include "cli/console.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>
#include <spdlog/formatter.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <stdexcept>

#include "units/byte_size.h"

namespace strata::cli {
namespace {

// The id of a line about a request ("request ID: ..."), else empty.
std::string_view request_id_of(std::string_view line) {
  constexpr std::string_view kPrefix = "request ";
  if (!line.starts_with(kPrefix)) return {};
  const size_t end = line.find(": ", kPrefix.size());
  return end == std::string_view::npos ? std::string_view() : line.substr(kPrefix.size(), end - kPrefix.size());
}

// {"time": ISO 8601 in UTC, "level", "node", "message", and "request_id" for a line about a request}.
class JsonFormatter final : public spdlog::formatter {
 public:
  explicit JsonFormatter(std::string node_id) : node_id_(std::move(node_id)) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const std::time_t seconds = std::chrono::system_clock::to_time_t(msg.time);
    const auto millis =
        std::chrono::duration_cast<std::chrono::milliseconds>(msg.time.time_since_epoch()).count() % 1000;
    std::tm utc{};
    gmtime_r(&seconds, &utc);
    char time[64];
    std::snprintf(time, sizeof time, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                  utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, static_cast<int>(millis));
    const std::string_view message(msg.payload.data(), msg.payload.size());
    nlohmann::json line{{"time", time},
                        {"level", std::string_view(spdlog::level::to_string_view(msg.level).data(),
                                                   spdlog::level::to_string_view(msg.level).size())},
                        {"node", node_id_},
                        {"message", message}};
    if (const std::string_view id = request_id_of(message); !id.empty()) line["request_id"] = id;
    // Invalid UTF-8 (a peer's text) is replaced, never a reason to lose the line.
    const std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + '\n';
    dest.append(text.data(), text.data() + text.size());
  }

  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonFormatter>(node_id_); }

 private:
  std::string node_id_;
};

spdlog::level::level_enum parse_level(const std::string& name) {
  const spdlog::level::level_enum level = spdlog::level::from_str(name);
  // from_str answers "off" for any name it does not know.
  if (level == spdlog::level::off || level == spdlog::level::critical || level == spdlog::level::trace) {
    throw std::invalid_argument("the log level is debug, info, warning or error, not '" + name + "'");
  }
  return level;
}

}  // namespace

// Writes each line on stderr; on a terminal the progress bar, when one is shown, stays under
// the lines.
class Console::Sink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  Sink() : terminal_(::isatty(STDERR_FILENO) == 1) {}

  // On a terminal: draws the bar and answers true; otherwise false (the console logs it as a line).
  bool draw_bar(const std::string& text, bool fetching) {
    if (!terminal_) return false;
    std::lock_guard lock(mutex_);
    bar_ = text;
    std::fprintf(stderr, "\r\033[K%s%s", text.c_str(), fetching ? "" : "\n");
    bar_shown_ = fetching;
    return true;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    if (bar_shown_) std::fputs("\r\033[K", stderr);
    std::fwrite(line.data(), 1, line.size(), stderr);
    if (bar_shown_) std::fputs(bar_.c_str(), stderr);
  }
  void flush_() override { std::fflush(stderr); }

 private:
  const bool terminal_;
  bool bar_shown_ = false;
  std::string bar_;
};

Console::Console(std::string node_id, LogFormat format, const std::string& level)
    : sink_(std::make_shared<Sink>()), logger_(std::make_shared<spdlog::logger>(node_id, sink_)) {
  if (format == LogFormat::Json) {
    logger_->set_formatter(std::make_unique<JsonFormatter>(node_id));
  } else {
    // The time of day in UTC, to the millisecond, so that the logs of several nodes tell what
    // happened when (a loss, a placement, a load) and how long it took.
    logger_->set_formatter(std::make_unique<spdlog::pattern_formatter>("strata[%n] %H:%M:%S.%e %l: %v",
                                                                       spdlog::pattern_time_type::utc));
  }
  logger_->set_level(parse_level(level));
  logger_->flush_on(spdlog::level::debug);
}

void Console::log(spdlog::level::level_enum level, const std::string& line) { logger_->log(level, line); }

void Console::progress(const cluster::TransferStats::Snapshot& s) {
  const uint64_t done = std::min(s.fetch_received_bytes, s.wanted_bytes);
  const double share = s.wanted_bytes > 0 ? static_cast<double>(done) / static_cast<double>(s.wanted_bytes) : 1.0;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(share * kWidth);
  char text[160];
  std::snprintf(text, sizeof text, "weights [%s%s] %3.0f%% %s of %s, %s/s, %.0f s left",
                std::string(static_cast<size_t>(filled), '#').c_str(),
                std::string(static_cast<size_t>(kWidth - filled), '.').c_str(), share * 100.0,
                units::describe_bytes(done).c_str(), units::describe_bytes(s.wanted_bytes).c_str(),
                units::describe_bytes(static_cast<uint64_t>(s.bytes_per_second)).c_str(), s.eta_seconds);
  if (sink_->draw_bar(text, s.fetching)) return;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(progress_mutex_);
  if (!s.fetching || now - last_progress_line_ >= std::chrono::seconds(5)) {
    logger_->info(text);
    last_progress_line_ = now;
  }
}

}  // namespace strata::cli
