#include "cli/cluster_watch.h"

#include <cstdio>
#include <cstdlib>

namespace strata::cli {

double metric_total(std::string_view exposition, std::string_view name) {
  double total = 0;
  size_t begin = 0;
  while (begin < exposition.size()) {
    size_t end = exposition.find('\n', begin);
    if (end == std::string_view::npos) end = exposition.size();
    const std::string_view line = exposition.substr(begin, end - begin);
    begin = end + 1;
    if (!line.starts_with(name) || line.size() <= name.size()) continue;
    const char after_name = line[name.size()];
    if (after_name != ' ' && after_name != '{') continue;
    // The value follows the last space outside the labels: label values may hold spaces.
    const size_t labels_end = after_name == '{' ? line.rfind('}') : name.size();
    if (labels_end == std::string_view::npos) continue;
    const std::string value(line.substr(labels_end + 1));
    total += std::strtod(value.c_str(), nullptr);
  }
  return total;
}

std::string live_figures(std::string_view before, std::string_view after, double seconds) {
  const auto per_second = [&](std::string_view name) {
    return seconds > 0 ? (metric_total(after, name) - metric_total(before, name)) / seconds : 0.0;
  };
  char text[256];
  std::snprintf(text, sizeof text,
                "generated %.1f tokens/s here, stage %.1f inputs/s, %.0f running, %.0f waiting, KV %.0f/%.0f blocks",
                per_second("strata_generation_tokens_total"), per_second("strata_stage_batch_inputs_sum"),
                metric_total(after, "strata_requests_running"), metric_total(after, "strata_requests_waiting"),
                metric_total(after, "strata_kv_blocks{state=\"used\"}"),
                metric_total(after, "strata_kv_pool_blocks"));
  return text;
}

std::string node_figures(const nlohmann::json& before, const nlohmann::json& after) {
  std::string out;
  for (const auto& node : after.value("nodes", nlohmann::json::array())) {
    if (!node.contains("kv_cache")) continue;  // no stage
    std::string rate = "-";
    for (const auto& earlier : before.value("nodes", nlohmann::json::array())) {
      if (earlier.value("id", "") != node.value("id", "")) continue;
      const double ms = node.value("described_unix_ms", 0.0) - earlier.value("described_unix_ms", 0.0);
      const double inputs = node.value("stage_inputs", 0.0) - earlier.value("stage_inputs", 0.0);
      if (ms > 0 && inputs >= 0) {
        char text[32];
        std::snprintf(text, sizeof text, "%.1f", inputs * 1000.0 / ms);
        rate = text;
      }
    }
    const auto& kv = node["kv_cache"];
    char line[256];
    std::snprintf(line, sizeof line, "  %s: stage %s inputs/s, KV %d/%d blocks", node.value("id", "?").c_str(),
                  rate.c_str(), kv.value("used_blocks", 0), kv.value("pool_blocks", 0));
    out += line;
    if (kv.contains("window")) {  // the sliding-window layers' pool
      std::snprintf(line, sizeof line, ", window KV %d/%d", kv["window"].value("used_blocks", 0),
                    kv["window"].value("pool_blocks", 0));
      out += line;
    }
    out += "\n";
  }
  return out;
}

std::string redrawn(std::string_view frame) {
  std::string out = "\033[H";
  size_t begin = 0;
  while (begin < frame.size()) {
    size_t end = frame.find('\n', begin);
    if (end == std::string_view::npos) end = frame.size();
    out.append(frame.substr(begin, end - begin));
    out += "\033[K\n";
    begin = end + 1;
  }
  return out + "\033[J";
}

}  // namespace strata::cli
