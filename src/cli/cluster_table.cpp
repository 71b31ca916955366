#include "cli/cluster_table.h"

#include <cstdio>

namespace strata::cli {
namespace {

using json = nlohmann::json;

// "0-10", or for a member of a tensor-parallel group its share too: "0-10 60%".
std::string layers_of(const json& placement, const std::string& node) {
  for (const json& stage : placement["stages"]) {
    const std::string layers =
        std::to_string(stage["first_layer"].get<int>()) + "-" + std::to_string(stage["last_layer"].get<int>() - 1);
    if (!stage.contains("group")) {
      if (stage["node"] == node) return layers;
      continue;
    }
    for (const json& member : stage["group"]) {
      if (member["node"] == node) {
        return layers + " " + std::to_string(static_cast<int>(member["share"].get<double>() * 100 + 0.5)) + "%";
      }
    }
  }
  return "-";
}

template <typename... Args>
void append(std::string& out, const char* format, Args... args) {
  const size_t at = out.size();
  const int length = std::snprintf(nullptr, 0, format, args...);
  out.resize(at + static_cast<size_t>(length) + 1);
  std::snprintf(out.data() + at, static_cast<size_t>(length) + 1, format, args...);
  out.resize(at + static_cast<size_t>(length));
}

}  // namespace

std::string cluster_table(const json& c) {
  std::string out;
  const json& placement = c["placement"];
  append(out, "model %s (hash %s, %d layers); leader %s; placement %llu (%s)%s\n",
         c["model"]["name"].get<std::string>().c_str(), c["model"]["hash"].get<std::string>().substr(0, 12).c_str(),
         c["model"]["layers"].get<int>(), c["leader"].get<std::string>().c_str(),
         static_cast<unsigned long long>(placement["epoch"].get<uint64_t>()),
         placement["strategy"].get<std::string>().c_str(), c["serving"].get<bool>() ? ", serving" : ", NOT serving");
  append(out, "%-18s %-8s %-22s %-22s %10s %11s %11s %8s %5s\n", "NODE", "STATE", "NODE ADDRESS", "API", "MEMORY",
         "SPEED", "LAYERS", "RTT", "SEQS");
  for (const json& n : c["nodes"]) {
    const std::string id = n["id"].get<std::string>() + (n["self"].get<bool>() ? " *" : "");
    const std::string rtt = n.contains("rtt_ms") ? std::to_string(n["rtt_ms"].get<double>()).substr(0, 5) + "ms" : "-";
    std::string state = n["state"].get<std::string>();
    if (n.contains("alive") && !n["alive"].get<bool>()) state = "lost";
    char speed[32];
    std::snprintf(speed, sizeof speed, "%.1f GB/s", n["weight_bytes_per_second"].get<double>() / 1e9);
    append(out, "%-18s %-8s %-22s %-22s %10s %11s %11s %8s %5llu\n", id.c_str(), state.c_str(),
           n["node_address"].get<std::string>().c_str(), n["api_address"].get<std::string>().c_str(),
           n["memory"].get<std::string>().c_str(), speed, layers_of(placement, n["id"]).c_str(), rtt.c_str(),
           static_cast<unsigned long long>(n["held_sequences"].get<uint64_t>()));
    if (n.contains("problem")) out += "    left out: " + n["problem"].get<std::string>() + "\n";
  }
  const std::string error = placement["error"].get<std::string>();
  if (!error.empty()) out += "\n" + error + "\n";
  if (!placement["reason"].get<std::string>().empty()) out += "\n" + placement["reason"].get<std::string>() + "\n";
  // A cluster whose placement failed waits for that failure to go away, which it just said.
  if (c.contains("waiting_for") && c["waiting_for"] != error) {
    out += "waiting for: " + c["waiting_for"].get<std::string>() + "\n";
  }
  return out;
}

}  // namespace strata::cli
