// `strata cluster`: what GET /cluster says, as a table for people.
#include <httplib.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "cli/commands.h"

namespace strata::cli {
namespace {

using json = nlohmann::json;

struct ClusterOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
};

std::string layers_of(const json& placement, const std::string& node) {
  for (const json& stage : placement["stages"]) {
    if (stage["node"] == node) {
      return std::to_string(stage["first_layer"].get<int>()) + "-" + std::to_string(stage["last_layer"].get<int>() - 1);
    }
  }
  return "-";
}

int print_cluster(const ClusterOptions& o) {
  httplib::Client client(o.host, o.port);
  client.set_connection_timeout(5);
  client.set_read_timeout(10);
  httplib::Headers headers;
  if (!o.api_key.empty()) headers.emplace("Authorization", "Bearer " + o.api_key);
  const httplib::Result result = client.Get("/cluster", headers);
  if (!result) {
    throw std::runtime_error("cannot reach http://" + o.host + ":" + std::to_string(o.port) + ": " +
                             httplib::to_string(result.error()));
  }
  if (result->status != 200) {
    throw std::runtime_error("GET /cluster answered " + std::to_string(result->status) + ": " + result->body);
  }
  const json c = json::parse(result->body);
  const json& placement = c["placement"];
  std::printf("model %s (hash %s, %d layers); leader %s; placement %llu (%s)%s\n",
              c["model"]["name"].get<std::string>().c_str(), c["model"]["hash"].get<std::string>().substr(0, 12).c_str(),
              c["model"]["layers"].get<int>(), c["leader"].get<std::string>().c_str(),
              static_cast<unsigned long long>(placement["epoch"].get<uint64_t>()),
              placement["strategy"].get<std::string>().c_str(), c["serving"].get<bool>() ? ", serving" : ", NOT serving");
  std::printf("%-18s %-8s %-22s %-22s %10s %11s %7s %8s %5s\n", "NODE", "STATE", "NODE ADDRESS", "API", "MEMORY",
              "SPEED", "LAYERS", "RTT", "SEQS");
  for (const json& n : c["nodes"]) {
    const std::string id = n["id"].get<std::string>() + (n["self"].get<bool>() ? " *" : "");
    const std::string rtt = n.contains("rtt_ms") ? std::to_string(n["rtt_ms"].get<double>()).substr(0, 5) + "ms" : "-";
    std::string state = n["state"].get<std::string>();
    if (n.contains("alive") && !n["alive"].get<bool>()) state = "lost";
    char speed[32];
    std::snprintf(speed, sizeof speed, "%.1f GB/s", n["weight_bytes_per_second"].get<double>() / 1e9);
    std::printf("%-18s %-8s %-22s %-22s %10s %11s %7s %8s %5llu\n", id.c_str(), state.c_str(),
                n["node_address"].get<std::string>().c_str(), n["api_address"].get<std::string>().c_str(),
                n["memory"].get<std::string>().c_str(), speed, layers_of(placement, n["id"]).c_str(), rtt.c_str(),
                static_cast<unsigned long long>(n["held_sequences"].get<uint64_t>()));
    if (n.contains("problem")) std::printf("    left out: %s\n", n["problem"].get<std::string>().c_str());
  }
  if (!placement["error"].get<std::string>().empty()) std::printf("\n%s\n", placement["error"].get<std::string>().c_str());
  if (!placement["reason"].get<std::string>().empty()) std::printf("\n%s\n", placement["reason"].get<std::string>().c_str());
  if (c.contains("waiting_for")) std::printf("waiting for: %s\n", c["waiting_for"].get<std::string>().c_str());
  return 0;
}

}  // namespace

void add_cluster_command(CLI::App& app, Action& action) {
  auto o = std::make_shared<ClusterOptions>();
  CLI::App* cmd = app.add_subcommand("cluster", "Show a running node's cluster: nodes, placement, links");
  cmd->add_option("--host", o->host, "Any node's API address")->capture_default_str();
  cmd->add_option("--port", o->port, "Its API port")->capture_default_str();
  cmd->add_option("--api-key", o->api_key, "The API key, when the node has one (also STRATA_API_KEY)")
      ->envname("STRATA_API_KEY");
  cmd->callback([&action, o] { action = [o] { return print_cluster(*o); }; });
}

}  // namespace strata::cli
