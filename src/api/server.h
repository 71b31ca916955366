// The OpenAI-compatible HTTP API over an engine::Generator.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "api/http_limits.h"
#include "api/model_facts.h"
#include "cluster_types/cluster_status.h"
#include "model/pooling.h"

namespace strata::engine {
class Generator;
}
namespace strata::tokenizer {
class Tokenizer;
}
namespace strata::gguf {
class File;
}

namespace strata::api {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port; Server::port() tells which
  // When set, every endpoint but /health needs "Authorization: Bearer <api_key>".
  std::optional<std::string> api_key;
  // When set, GET /metrics needs this key instead of api_key.
  std::optional<std::string> metrics_key;
  http::Limits limits;  // sizes, deadlines and connection caps for clients
  // Host names the server answers to besides IP literals and "localhost" (DNS rebinding).
  std::vector<std::string> host_names;
  // Origins that browsers may call the API from ("*": any); none by default.
  std::vector<std::string> cors_origins;
  bool log_requests = false;  // one line per answered request, of every endpoint
  // Where the server's log lines go: those about requests (one per generation, and those of
  // log_requests) each start "request ID:"; unset: stderr.
  std::function<void(const std::string& line)> log;
  // What Ollama's /api/tags, /api/show and /api/ps tell about the model; unset: its name only.
  std::optional<ModelFacts> model_facts;
  // How the model pools embeddings (its GGUF's pooling_type) and their width: /v1/embeddings
  // and /api/embed answer 400 for a model that declares no pooling.
  model::Pooling embedding_pooling = model::Pooling::None;
  int embedding_dim = 0;
  // A chat template (Jinja2 text) that serve_until_signal uses instead of the GGUF's.
  std::optional<std::string> chat_template;
  // The template for requests that offer tools (a GGUF's tokenizer.chat_template.tool_use);
  // empty: the chat template renders them too. serve_until_signal sets it from the GGUF.
  std::string tool_use_chat_template;
  // What GET /health answers on a cluster node (api/cluster_json.h); unset: 200 {"status":"ok"}.
  std::function<cluster_types::NodeHealth()> health;
  // GET /cluster's answer (api/cluster_json.h), behind the API key like every endpoint but
  // /health; unset: 404.
  std::function<cluster_types::ClusterStatus()> cluster_status;
  // How long a streamed request that comes before the model can run (a cluster forming,
  // weights loading) waits, with an SSE comment line a second saying for what, before it ends
  // with an error event (code 503). Other requests wait inside the generator's submit.
  std::chrono::milliseconds startup_wait{60000};
  // POST /cluster/drain calls it (behind the API key) with the body's "force": a cluster node
  // leaves its cluster and exits, as on SIGTERM, and the answer is 202; or, unless forced, it
  // says why the node should not leave (its cluster cannot do without it), and the answer is
  // 409 with that. Unset: 404.
  std::function<std::string(bool force)> drain;
  // serve_until_signal calls it when a signal asks the server to stop, before it stops, with
  // the API still serving: a cluster node leaves its cluster there.
  std::function<void()> on_stopping;
  // serve_until_signal calls it with the bound port once the server listens.
  std::function<void(int port)> on_listening;
};

// The longest Server::stop() takes.
inline constexpr int kStopGraceSeconds = 10;

class Server {
 public:
  // `chat_template`: the model's Jinja2 chat template, which renders every chat prompt; empty (a
  // GGUF without tokenizer.chat_template): ChatML. Throws jinja::TemplateError, naming the line,
  // when the template uses what the renderer does not support.
  Server(engine::Generator& generator, const tokenizer::Tokenizer& tokenizer,
         std::string model_name, std::string chat_template, ServerOptions options);
  ~Server();  // stops
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and serves on background threads. Throws std::runtime_error when it cannot bind.
  void start();
  int port() const;
  // Requests still in flight end with an error; returns once every connection is closed, within
  // kStopGraceSeconds whatever the clients do. The generator is left running: shut it down
  // afterwards.
  void stop();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// What `strata serve` answers while it has no model yet (a node that waits for its peers' model):
// GET /health 503 with {"status": "waiting", "waiting_for": ...}, every other request (behind
// the API key) 503 with Retry-After, saying what it waits for. Listens from its construction
// (throws std::runtime_error when it cannot bind) until it is destroyed.
class WaitingServer {
 public:
  WaitingServer(const ServerOptions& options, std::function<std::string()> waiting_for);
  ~WaitingServer();
  WaitingServer(const WaitingServer&) = delete;
  WaitingServer& operator=(const WaitingServer&) = delete;

  int port() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// The name the API serves a model file under: its file name without ".gguf".
std::string model_name_from_path(const std::string& model_path);

// What `strata serve` runs once the model is loaded: serves `model` (its name from its path, its
// chat template from its metadata) until SIGINT or SIGTERM, then stops the server.
void serve_until_signal(engine::Generator& generator, const tokenizer::Tokenizer& tokenizer,
                        const gguf::File& model, const ServerOptions& options);
// Makes serve_until_signal go on as if it had received SIGTERM.
void request_stop();

}  // namespace strata::api
