// `strata cluster`: what GET /cluster says, as a table for people, once or redrawn every
// second with live figures from /metrics (--watch). `strata drain`: a node leaves its cluster,
// handing its work over, and exits.
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "cli/cluster_table.h"
#include "cli/cluster_watch.h"
#include "cli/commands.h"

namespace strata::cli {
namespace {

using json = nlohmann::json;

struct ClusterOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  bool force = false;  // drain: leave even when the cluster cannot do without the node
  bool watch = false;  // cluster: redraw every second
};

std::string address_of(const ClusterOptions& o) { return "http://" + o.host + ":" + std::to_string(o.port); }

// Why a request got no answer, in words (httplib names its errors as enumerators: "Connection").
std::string why_unanswered(httplib::Error error) {
  switch (error) {
    case httplib::Error::Connection:
      return "nothing accepts connections there (is `strata serve` running, with this --host and --port?)";
    case httplib::Error::ConnectionTimeout:
      return "the connection timed out";
    case httplib::Error::Read:
      return "the connection ended before the answer did";
    case httplib::Error::Write:
      return "the connection ended while the request was sent";
    default:
      return httplib::to_string(error);
  }
}

std::string unreachable(const ClusterOptions& o, httplib::Error error) {
  return "cannot reach " + address_of(o) + ": " + why_unanswered(error);
}

httplib::Headers headers_for(const ClusterOptions& o) {
  httplib::Headers headers;
  if (!o.api_key.empty()) headers.emplace("Authorization", "Bearer " + o.api_key);
  return headers;
}

int print_cluster(const ClusterOptions& o) {
  httplib::Client client(o.host, o.port);
  client.set_connection_timeout(5);
  client.set_read_timeout(10);
  const httplib::Result result = client.Get("/cluster", headers_for(o));
  if (!result) throw std::runtime_error(unreachable(o, result.error()));
  if (result->status != 200) {
    throw std::runtime_error("GET /cluster answered " + std::to_string(result->status) + ": " + result->body);
  }
  std::fputs(cluster_table(json::parse(result->body)).c_str(), stdout);
  return 0;
}

std::atomic<bool> watch_interrupted{false};
extern "C" void stop_watching(int) { watch_interrupted = true; }

// One frame: the time, the table and the live figures, or why the node does not answer.
std::string watch_frame(httplib::Client& client, const ClusterOptions& o, std::string& last_metrics,
                        std::chrono::steady_clock::time_point& last_scrape, std::deque<json>& statuses) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char clock[16];
  std::strftime(clock, sizeof clock, "%H:%M:%S", &local);
  std::string frame = std::string("strata cluster at ") + address_of(o) + ", " + clock + " (Ctrl-C ends)\n";
  const httplib::Result status = client.Get("/cluster", headers_for(o));
  if (!status || status->status != 200) {
    return frame + "the node does not answer: " +
           (status ? "HTTP " + std::to_string(status->status) : why_unanswered(status.error())) + "\n";
  }
  // Rates over the last few seconds: other nodes' figures move on with the gossip, a second or
  // so apart.
  constexpr size_t kRateFrames = 5;
  statuses.push_back(json::parse(status->body));
  if (statuses.size() > kRateFrames) statuses.pop_front();
  frame += cluster_table(statuses.back());
  if (statuses.size() > 1) frame += "\n" + node_figures(statuses.front(), statuses.back());
  const httplib::Result metrics = client.Get("/metrics", headers_for(o));
  const auto scraped = std::chrono::steady_clock::now();
  if (metrics && metrics->status == 200) {
    if (!last_metrics.empty()) {
      frame += "\n" + live_figures(last_metrics, metrics->body,
                                    std::chrono::duration<double>(scraped - last_scrape).count()) + "\n";
    }
    last_metrics = metrics->body;
    last_scrape = scraped;
  }
  return frame;
}

// On a terminal the frame is drawn over the last one; otherwise each frame follows the last,
// as plain lines.
int watch_cluster(const ClusterOptions& o) {
  httplib::Client client(o.host, o.port);
  client.set_connection_timeout(2);
  client.set_read_timeout(5);
  const bool terminal = ::isatty(STDOUT_FILENO) == 1;
  watch_interrupted = false;
  std::signal(SIGINT, stop_watching);
  std::signal(SIGTERM, stop_watching);
  if (terminal) std::fputs("\033[?25l\033[2J", stdout);  // no cursor; a clear screen once
  std::string last_metrics;
  auto last_scrape = std::chrono::steady_clock::now();
  std::deque<json> statuses;
  while (!watch_interrupted) {
    const std::string frame = watch_frame(client, o, last_metrics, last_scrape, statuses);
    std::fputs(terminal ? redrawn(frame).c_str() : (frame + "\n").c_str(), stdout);
    std::fflush(stdout);
    for (int tick = 0; tick < 10 && !watch_interrupted; ++tick) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  if (terminal) std::fputs("\033[?25h", stdout);
  return 0;
}

// The node leaves as on SIGTERM; it is gone once its API no longer answers.
int drain(const ClusterOptions& o) {
  httplib::Client client(o.host, o.port);
  client.set_connection_timeout(5);
  client.set_read_timeout(10);
  const httplib::Result result =
      client.Post("/cluster/drain", headers_for(o), o.force ? R"({"force":true})" : "", "application/json");
  if (!result) throw std::runtime_error(unreachable(o, result.error()));
  if (result->status == 409) {
    const json body = json::parse(result->body, nullptr, false);
    const std::string why = body.is_object() && body.contains("error") ? body["error"].value("message", result->body)
                                                                       : result->body;
    throw std::runtime_error(why + " (strata drain --force)");
  }
  if (result->status != 202) {
    throw std::runtime_error("POST /cluster/drain answered " + std::to_string(result->status) + ": " + result->body);
  }
  std::fprintf(stderr, "the node at %s leaves: the others take its layers over, the state of the sequences it "
               "holds moves to them, and its clients' requests finish...\n", address_of(o).c_str());
  constexpr auto kPoll = std::chrono::milliseconds(500);
  constexpr auto kLimit = std::chrono::seconds(90);  // the node's own hand-over limit, and its shutdown
  const auto started = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - started < kLimit) {
    std::this_thread::sleep_for(kPoll);
    if (!client.Get("/health")) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      std::fprintf(stderr, "the node has left the cluster and stopped (%.1f s)\n", seconds);
      return 0;
    }
  }
  throw std::runtime_error("the node at " + address_of(o) + " still answers after " +
                           std::to_string(kLimit.count()) + " s; its log says why");
}

void add_node_options(CLI::App& cmd, ClusterOptions& o, const char* which) {
  cmd.add_option("--host", o.host, which)->capture_default_str();
  cmd.add_option("--port", o.port, "Its API port")->capture_default_str();
  cmd.add_option("--api-key", o.api_key, "The API key, when the node has one (also STRATA_API_KEY)")
      ->envname("STRATA_API_KEY");
}

}  // namespace

void add_cluster_command(CLI::App& app, Action& action) {
  auto o = std::make_shared<ClusterOptions>();
  CLI::App* cmd = app.add_subcommand("cluster", "Show a running node's cluster: nodes, placement, links");
  add_node_options(*cmd, *o, "Any node's API address");
  cmd->add_flag("--watch", o->watch, "Redraw the table every second, with live figures from the node's /metrics");
  cmd->callback([&action, o] { action = [o] { return o->watch ? watch_cluster(*o) : print_cluster(*o); }; });
}

void add_drain_command(CLI::App& app, Action& action) {
  auto o = std::make_shared<ClusterOptions>();
  CLI::App* cmd = app.add_subcommand(
      "drain", "Make a node leave its cluster without losing work: its sequences move to the other nodes, then it exits");
  add_node_options(*cmd, *o, "The node's API address");
  cmd->add_flag("--force", o->force,
                "Leave even when no other node runs, or the others cannot hold the model (its requests end)");
  cmd->callback([&action, o] { action = [o] { return drain(*o); }; });
}

}  // namespace strata::cli
