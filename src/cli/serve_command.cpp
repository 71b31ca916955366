#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>

#include "api/server.h"
#include "cli/commands.h"
#include "cli/model_source.h"
#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

namespace strata::cli {
namespace {

struct ServeOptions {
  std::string model;
  api::ServerOptions server;
  std::optional<std::string> api_key;
  engine::EngineOptions engine;
};

// CLI11 skips an empty environment variable, which would turn authentication off unnoticed.
std::optional<std::string> api_key_from(const ServeOptions& o) {
  if (o.api_key) return o.api_key;
  if (const char* key = std::getenv("STRATA_API_KEY")) return key;
  return std::nullopt;
}

int serve(const ServeOptions& o) {
  api::ServerOptions server = o.server;
  server.api_key = api_key_from(o);
  if (server.api_key && server.api_key->empty()) {
    throw std::runtime_error("the API key is empty; give a key with --api-key or STRATA_API_KEY, "
                             "or set neither to serve without one");
  }
  const LoadedModel loaded = load_for_generation(o.model, o.engine);
  engine::Engine& engine = *loaded.engine;
  const engine::ModelLimits limits = engine.limits();
  std::fprintf(stderr, "strata: context %d tokens, %d parallel sequences, queue of %d\n", limits.context_size,
               limits.max_parallel, limits.max_queued);
  api::serve_until_signal(engine, *loaded.tokenizer, *loaded.file, server);
  engine.shutdown();
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app, Action& action) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve the OpenAI-compatible API");
  cmd->add_option("-m,--model", o->model, "GGUF model file (default: the generated demo model)");
  cmd->add_option("--host", o->server.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->server.port, "Port (0: any free port)")->capture_default_str();
  cmd->add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' (also from STRATA_API_KEY)");
  cmd->add_option("--parallel", o->engine.max_parallel, "Sequences decoded together")
      ->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--queue", o->engine.max_queued, "Requests that may wait for a slot; more get HTTP 429")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->engine.context_size, "Context size per request (default: the model's)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("-t,--threads", o->engine.threads, "Threads (default: all cores)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--allowed-host", o->server.host_names,
                  "Host name clients may reach the server by, besides IP addresses and localhost (repeatable)");
  cmd->add_option("--cors-origin", o->server.cors_origins,
                  "Origin browsers may call the API from, or '*' (repeatable; default: none)");
  cmd->add_flag("--log-requests", o->server.log_requests, "Print one line per answered request to stderr");
  cmd->callback([&action, o] { action = [o] { return serve(*o); }; });
}

}  // namespace strata::cli
