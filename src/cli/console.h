// What a serving node writes on stderr: its log lines, with their level, as text or as one JSON
// object a line, and the progress of a fetch of weights (on a terminal a bar redrawn in place
// under the log lines; otherwise a plain line every few seconds).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include <spdlog/logger.h>

#include "cluster/weights.h"

namespace strata::cli {

enum class LogFormat { Text, Json };

class Console {
 public:
  // `level`: the least level written ("debug", "info", "warning" or "error").
  Console(std::string node_id, LogFormat format, const std::string& level);

  // A line about a request starts "request ID: " (the id the API answered with): JSON lines
  // then carry that id as their request_id too.
  void log(spdlog::level::level_enum level, const std::string& line);
  void progress(const cluster::TransferStats::Snapshot& s);

 private:
  class Sink;
  std::shared_ptr<Sink> sink_;
  std::shared_ptr<spdlog::logger> logger_;
  std::mutex progress_mutex_;
  std::chrono::steady_clock::time_point last_progress_line_{};  // of the lines off a terminal
};

}  // namespace strata::cli
