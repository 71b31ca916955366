#include "api/server.h"

#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <stdexcept>
#include <thread>

#include "api/anthropic.h"
#include "api/api_error.h"
#include "api/chat_template.h"
#include "api/client_watch.h"
#include "api/cluster_json.h"
#include "api/embeddings.h"
#include "api/generation_session.h"
#include "api/http_server.h"
#include "api/request.h"
#include "api/request_observer.h"
#include "api/responses.h"
#include "api/responses_api.h"
#include "api/tool_choice_grammar.h"
#include "engine/generator.h"
#include "gguf/gguf.h"
#include "metrics/metrics.h"
#include "tokenizer/tokenizer.h"
#include "web/assets.h"

namespace strata::api {
namespace {

constexpr int64_t kMinHttpThreads = 8;
constexpr int64_t kMaxHttpThreads = 512;

// Compares in time independent of where the strings differ, so the key cannot be guessed by timing.
bool same_secret(std::string_view given, std::string_view expected) {
  unsigned char difference = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i) {
    difference |=
        static_cast<unsigned char>(given[i] ^ expected[i % std::max<size_t>(expected.size(), 1)]);
  }
  return difference == 0 && !expected.empty();
}

// The credentials of "Bearer <key>"; the scheme is case-insensitive and may be followed by
// several spaces (RFC 7235). Empty for any other scheme.
std::string_view bearer_credentials(std::string_view authorization) {
  constexpr std::string_view kScheme = "bearer";
  if (authorization.size() <= kScheme.size() || authorization[kScheme.size()] != ' ') return {};
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) return {};
  }
  const size_t key = authorization.find_first_not_of(' ', kScheme.size());
  return key == std::string_view::npos ? std::string_view() : authorization.substr(key);
}

// The most bytes of text one token can stand for: the longest piece in the vocabulary, or a
// control token's name written out in a prompt (token_piece does not show those; none is near
// 128 bytes).
size_t longest_token_bytes(const tokenizer::Tokenizer& tokenizer) {
  size_t longest = 128;
  for (int token = 0; token < tokenizer.vocab_size(); ++token) {
    longest = std::max(longest, tokenizer.token_piece(token).size());
  }
  return longest;
}

size_t prompt_text_bytes(const CompletionRequest& request) {
  size_t bytes = request.prompt.size();
  for (const auto& message : request.messages) {
    bytes += message.content.size() + message.reasoning_content.size();
    for (const auto& call : message.tool_calls) bytes += call.name.size() + call.arguments.size();
  }
  if (!request.tools.empty()) bytes += request.tools.dump().size();
  return bytes;
}

// A generation that stops by itself after calling tools ends with "tool_calls": the client is to
// run them.
Finish finish_of(const GenerationOutcome& outcome, const GenerationSession& session) {
  if (outcome.kind == GenerationOutcome::Kind::Length) return {"length", {}};
  return {session.tool_calls() > 0 ? "tool_calls" : "stop", outcome.stop_sequence};
}

http::Options http_options(const ServerOptions& options, int64_t workers) {
  std::vector<std::string> host_names = options.host_names;
  host_names.push_back(options.host);  // when it is a name, clients use it
  return {options.host, options.port, options.limits, std::move(host_names),
          size_t(std::clamp(workers, kMinHttpThreads, kMaxHttpThreads))};
}

void check_api_key(const ServerOptions& options, const http::Request& request) {
  // A scraper may hold a key of its own that opens nothing else.
  const std::optional<std::string>& key =
      request.path == "/metrics" && options.metrics_key ? options.metrics_key : options.api_key;
  // The dashboard's own files are open: the page asks for the key and sends it with its calls.
  const bool dashboard_file = request.method == "GET" && web::find_asset(request.path) != nullptr;
  // Anthropic's clients send the key as x-api-key, OpenAI's as a bearer token.
  if (key && request.path != "/health" && !dashboard_file &&
      !same_secret(bearer_credentials(request.header("Authorization")), *key) &&
      !same_secret(request.header("x-api-key"), *key)) {
    throw ApiError(401,
                   "Incorrect or missing API key. Send it as \"Authorization: Bearer <key>\" or \"x-api-key: <key>\".",
                   {}, "invalid_api_key");
  }
}

// Ollama's and Anthropic's clients expect their error shapes on their endpoints.
http::Response error_response(const http::Request& request, const ApiError& error) {
  http::Response response;
  response.status = error.status;
  if (request.path.starts_with("/api/")) {
    response.body = ollama_error_body(error);
  } else if (request.path.starts_with("/v1/messages")) {
    response.body = anthropic_error_body(error);
  } else {
    response.body = openai_error_body(error);
  }
  if (error.status == 429 || error.status == 503) {
    response.headers.emplace_back("Retry-After", std::to_string(std::max(1, error.retry_after_seconds)));
  }
  return response;
}

std::string refusal_code(int status) {
  switch (status) {
    case 403:
      return "host_not_allowed";
    case 413:
      return "request_too_large";
    case 415:
      return "unsupported_media_type";
    case 431:
      return "request_header_too_large";
    case 503:
      return "too_many_connections";
    default:
      return "invalid_request";
  }
}

// The Access-Control-Allow-Origin value for the request's Origin, when it is allowed.
std::optional<std::string> cors_origin(const ServerOptions& options, const http::Request& request) {
  const std::string origin = request.header("Origin");
  if (origin.empty()) return std::nullopt;
  for (const auto& allowed : options.cors_origins) {
    if (allowed == "*" || allowed == origin) return allowed;
  }
  return std::nullopt;
}

ApiError model_not_ready(const std::string& why) {
  return ApiError(503, "the model is not ready to run requests yet: waiting for " + why, {}, "model_unavailable");
}

std::function<void(const std::string&)> request_log(const ServerOptions& options) {
  if (options.log) return options.log;
  return [](const std::string& line) { std::fprintf(stderr, "strata: %s\n", line.c_str()); };
}

// What every answer gets on its way out: its request's id, CORS headers for allowed origins,
// and its log line.
http::Response sent(const ServerOptions& options, const http::Request& request, http::Response response) {
  if (!request.id.empty()) response.headers.emplace_back("x-request-id", request.id);
  if (const auto origin = cors_origin(options, request)) {
    response.headers.emplace_back("Access-Control-Allow-Origin", *origin);
    if (*origin != "*") response.headers.emplace_back("Vary", "Origin");
    response.headers.emplace_back("Access-Control-Expose-Headers", "x-request-id");
  }
  if (options.log_requests) {
    request_log(options)("request " + request.id + ": " + request.remote_address + " " + request.method + " " +
                         request.path + " " + std::to_string(response.status));
  }
  return response;
}

}  // namespace

class Server::Impl final : public http::Service {
 public:
  Impl(engine::Generator& generator, const tokenizer::Tokenizer& tokenizer, std::string model_name,
       std::string_view chat_template, ServerOptions options)
      : generator_(generator),
        tokenizer_(tokenizer),
        model_name_(std::move(model_name)),
        chat_template_(chat_template),
        model_template_(chat_template.empty()
                            ? std::nullopt
                            : std::optional<ModelChatTemplate>(std::in_place, chat_template,
                                                               options.tool_use_chat_template)),
        longest_token_bytes_(longest_token_bytes(tokenizer)),
        options_(std::move(options)),
        log_(request_log(options_)),
        created_(unix_time()),
        http_(http_options(options_, workers_for(generator.limits())), *this) {
    if (options_.api_key && options_.api_key->empty()) {
      throw std::invalid_argument("The API key is empty; leave it unset to serve without one.");
    }
    add_routes();
  }

  ~Impl() override { stop(); }

  void start() { port_ = http_.start(); }

  int port() const { return port_; }

  void stop() {
    {
      std::unique_lock lock(sessions_mutex_);
      stopping_ = true;
      for (const auto& session : sessions_) session->abandon();
      // Let each answer in flight end with its error before the connections close. A client
      // that does not read gets kSessionsGrace, then kAnswerGrace for what is being written.
      constexpr std::chrono::seconds kSessionsGrace{5};
      sessions_ended_.wait_for(lock, kSessionsGrace, [&] { return sessions_.empty(); });
    }
    constexpr std::chrono::seconds kAnswerGrace{2};
    http_.stop(kAnswerGrace);
  }

  http::Response handle(const http::Request& request) override {
    std::string endpoint = "other";
    http::Response response = sent(options_, request, answer(request, endpoint));
    count_answer(endpoint, response.status);
    return response;
  }

  http::Response refuse(const http::Request& request, int status,
                        const std::string& message) override {
    return error_response(request, ApiError(status, message, {}, refusal_code(status)));
  }

 private:
  using RouteHandler = std::function<http::Response(const http::Request&, const std::smatch&)>;
  struct Route {
    std::string method;
    std::string endpoint;  // names it in metrics: its path pattern, unless given a name
    std::regex path;
    RouteHandler handler;
  };

  // Every running or queued request holds a worker while it waits for tokens; the spare ones
  // keep /health and errors answering when the engine is full.
  static int64_t workers_for(engine::ModelLimits limits) {
    return int64_t{limits.max_parallel} + limits.max_queued + 4;
  }

  void route(std::string method, const std::string& path, RouteHandler handler, std::string endpoint = {}) {
    routes_.push_back({std::move(method), endpoint.empty() ? path : std::move(endpoint), std::regex(path),
                       std::move(handler)});
  }

  static http::Response json_response(std::string body) {
    http::Response response;
    response.body = std::move(body);
    return response;
  }

  void add_routes() {
    route("GET", "/health", [this](const http::Request&, const std::smatch&) {
      if (!options_.health) return json_response(R"({"status":"ok"})");
      auto [status, body] = health_json(options_.health());
      http::Response response = json_response(std::move(body));
      response.status = status;
      return response;
    });
    if (options_.cluster_status) {
      route("GET", "/cluster", [this](const http::Request&, const std::smatch&) {
        return json_response(cluster_status_json(options_.cluster_status()));
      });
    }
    if (options_.drain) {
      route("POST", "/cluster/drain", [this](const http::Request& request, const std::smatch&) {
        const std::string refused = options_.drain(parse_drain_force(request.body));
        if (!refused.empty()) {
          throw ApiError(409, "The node stays: " + refused + ". Drain it with {\"force\": true} to make it leave anyway.",
                         {}, "drain_refused");
        }
        http::Response response = json_response(R"({"status":"leaving"})");
        response.status = 202;
        return response;
      });
    }
    route("GET", "/|/[A-Za-z0-9_-]+\\.(html|js|css|svg)", [](const http::Request& request, const std::smatch&) {
      const web::Asset* asset = web::find_asset(request.path);
      if (asset == nullptr) throw ApiError(404, "Unknown file: " + request.path, {}, "unknown_url");
      http::Response response;
      response.content_type = std::string(asset->content_type);
      response.body = std::string(asset->bytes);
      // The page may talk to this node only, and loads nothing from anywhere else.
      response.headers = {{"Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'"},
                          {"X-Content-Type-Options", "nosniff"},
                          {"Cache-Control", "no-cache"}};
      return response;
    }, "dashboard");
    route("GET", "/requests", [](const http::Request&, const std::smatch&) {
      return json_response(recent_requests_json());
    });
    route("GET", "/metrics", [](const http::Request&, const std::smatch&) {
      http::Response response;
      response.content_type = "text/plain; version=0.0.4; charset=utf-8";
      response.body = metrics::process_registry().text();
      return response;
    });
    route("GET", "/v1/models", [this](const http::Request&, const std::smatch&) {
      return json_response(openai_models_body(model_name_, created_));
    });
    route("GET", "/v1/models/(.+)", [this](const http::Request&, const std::smatch& match) {
      check_model(match[1].str());
      return json_response(openai_model_body(model_name_, created_));
    });
    // Lambdas capture the pair's member, not a structured binding: clang 14 cannot capture those.
    for (const auto& path_and_endpoint : {std::pair("/v1/chat/completions", Endpoint::ChatCompletions),
                                          std::pair("/v1/completions", Endpoint::Completions)}) {
      route("POST", path_and_endpoint.first, [this, endpoint = path_and_endpoint.second](
                                                 const http::Request& request, const std::smatch&) {
        return handle_completion(request, [&] {
          auto parsed = parse_completion_request(endpoint, request.body);
          return std::pair(parsed, openai_writer(parsed));
        });
      });
    }
    route("POST", "/v1/responses", [this](const http::Request& request, const std::smatch&) {
      return handle_completion(request, [&] {
        ResponsesRequest read = read_responses_request(request.body);
        return std::pair(parse_completion_request(Endpoint::ChatCompletions, read.chat_body),
                         responses_api_writer(model_name_, std::move(read.settings)));
      });
    });
    route("POST", "/v1/messages", [this](const http::Request& request, const std::smatch&) {
      return handle_completion(request, [&] {
        const std::string chat = chat_body_from_anthropic(AnthropicEndpoint::Messages, request.body);
        return std::pair(parse_completion_request(Endpoint::ChatCompletions, chat),
                         anthropic_response_writer(model_name_));
      });
    });
    route("POST", "/v1/messages/count_tokens", [this](const http::Request& request, const std::smatch&) {
      const std::string chat = chat_body_from_anthropic(AnthropicEndpoint::CountTokens, request.body);
      const CompletionRequest parsed = parse_completion_request(Endpoint::ChatCompletions, chat);
      check_model(parsed.model);
      check_prompt_size(parsed);
      return json_response(anthropic_count_tokens_body(static_cast<int>(prompt_of(parsed).tokens.size())));
    });
    route("POST", "/v1/embeddings", [this](const http::Request& request, const std::smatch&) {
      return handle_embeddings(request, EmbeddingDialect::OpenAI);
    });
    route("POST", "/api/embed", [this](const http::Request& request, const std::smatch&) {
      return handle_embeddings(request, EmbeddingDialect::Ollama);
    });
    route("GET", "/api/tags", [this](const http::Request&, const std::smatch&) {
      return json_response(ollama_tags_body(model_name_, model_facts()));
    });
    route("GET", "/api/ps", [this](const http::Request&, const std::smatch&) {
      return json_response(ollama_ps_body(model_name_, model_facts(), generator_.limits().context_size));
    });
    route("POST", "/api/show", [this](const http::Request& request, const std::smatch&) {
      check_model(parse_ollama_show_model(request.body));
      return json_response(ollama_show_body(model_facts(), chat_template_, generator_.limits().context_size));
    });
    route("GET", "/api/version", [](const http::Request&, const std::smatch&) {
      return json_response(ollama_version_body());
    });
    for (const auto& path_and_endpoint : {std::pair("/api/chat", OllamaEndpoint::Chat),
                                          std::pair("/api/generate", OllamaEndpoint::Generate)}) {
      route("POST", path_and_endpoint.first, [this, endpoint = path_and_endpoint.second](
                                                 const http::Request& request, const std::smatch&) {
        return handle_completion(request, [&] {
          auto parsed = parse_ollama_request(endpoint, request.body);
          return std::pair(parsed, ollama_response_writer(endpoint, model_name_));
        });
      });
    }
  }

  // `endpoint`: set to the pattern of the route the request reached.
  http::Response answer(const http::Request& request, std::string& endpoint) {
    try {
      if (is_cors_preflight(request)) return cors_preflight();
      admit(request);
      for (const auto& route : routes_) {
        std::smatch match;
        if (route.method == request.method && std::regex_match(request.path, match, route.path)) {
          endpoint = route.endpoint;
          return route.handler(request, match);
        }
      }
      throw ApiError(404, "Unknown endpoint: " + request.method + " " + request.path, {},
                     "unknown_url");
    } catch (const ApiError& error) {
      return error_response(request, error);
    } catch (const std::exception& error) {
      return error_response(request, ApiError(500, std::string("Internal error: ") + error.what()));
    }
  }

  void admit(const http::Request& request) const {
    if (stopping_) throw ApiError(503, "The server is shutting down.");
    check_api_key(options_, request);
  }

  bool is_cors_preflight(const http::Request& request) const {
    return request.method == "OPTIONS" && cors_origin(options_, request) &&
           !request.header("Access-Control-Request-Method").empty();
  }

  static http::Response cors_preflight() {
    http::Response response;
    response.status = 204;
    response.headers = {{"Access-Control-Allow-Methods", "GET, POST"},
                        {"Access-Control-Allow-Headers", "Authorization, Content-Type"},
                        {"Access-Control-Max-Age", "600"}};
    return response;
  }

  const ModelFacts& model_facts() const {
    static const ModelFacts kUnknown;
    return options_.model_facts ? *options_.model_facts : kUnknown;
  }

  void check_model(const std::optional<std::string>& model) const {
    if (model && *model != model_name_) {
      throw ApiError(
          404,
          "The model '" + *model + "' does not exist; this server serves '" + model_name_ + "'.",
          "model", "model_not_found");
    }
  }

  // Text that cannot fit the context whatever its tokens is refused before it is tokenized, which
  // for megabytes of text would take seconds.
  void check_prompt_size(const CompletionRequest& request) const {
    const int context = generator_.limits().context_size;
    const size_t bytes = prompt_text_bytes(request);
    if (bytes <= size_t(context) * longest_token_bytes_) return;
    const std::string input = request.endpoint == Endpoint::ChatCompletions ? "messages" : "prompt";
    throw ApiError(400,
                   "This model's maximum context length is " + std::to_string(context) +
                       " tokens, and the " + input + " hold " + std::to_string(bytes) +
                       " bytes of text, more than that many tokens can stand for. Please reduce "
                       "the length of the " + input + ".",
                   input, "context_length_exceeded");
  }

  // The completion budget: what the client asked for, or else what is left of the context.
  int completion_budget(Endpoint endpoint, int prompt_tokens, std::optional<int> requested) const {
    const int context = generator_.limits().context_size;
    const int budget = requested.value_or(context - prompt_tokens);
    if (budget >= 1 && int64_t{prompt_tokens} + budget <= context) return budget;
    const std::string input = endpoint == Endpoint::ChatCompletions ? "messages" : "prompt";
    const int64_t completion = std::max(budget, 1);
    throw ApiError(
        400,
        "This model's maximum context length is " + std::to_string(context) +
            " tokens. However, you requested " + std::to_string(prompt_tokens + completion) +
            " tokens (" + std::to_string(prompt_tokens) + " in the " + input + ", " +
            std::to_string(completion) + " in the completion). Please reduce the length of the " +
            input + " or completion.",
        input, "context_length_exceeded");
  }

  ChatPrompt prompt_of(const CompletionRequest& request) const {
    if (request.endpoint != Endpoint::ChatCompletions) return {completion_prompt_tokens(tokenizer_, request.prompt)};
    if (!request.tools.empty() && !model_template_) {
      throw ApiError(400, "This model has no chat template of its own, so it cannot be offered tools.",
                     "tools", "unsupported_parameter");
    }
    return model_template_ ? model_template_->prompt(tokenizer_, request)
                           : ChatPrompt{chatml_prompt_tokens(tokenizer_, request.messages)};
  }

  std::unique_ptr<ResponseWriter> openai_writer(const CompletionRequest& request) const {
    return openai_response_writer(
        {request.endpoint, model_name_, request.logprobs, request.include_usage});
  }

  // `parse` reads the body in one of the dialects and picks the writer for its answer.
  using Parse = std::function<std::pair<CompletionRequest, std::unique_ptr<ResponseWriter>>()>;

  http::Response handle_completion(const http::Request& http_request, const Parse& parse) {
    auto [request, writer] = parse();
    check_model(request.model);
    check_prompt_size(request);
    const bool chat = request.endpoint == Endpoint::ChatCompletions;
    ChatPrompt prompt = prompt_of(request);
    const std::optional<OutputReading> reading = chat ? output_reading(request, prompt) : std::nullopt;
    const Usage prompt_usage{static_cast<int>(prompt.tokens.size()), 0, 0, 0, std::nullopt};
    engine::GenerationRequest generation{
        std::move(prompt.tokens),
        completion_budget(request.endpoint, prompt_usage.prompt_tokens, request.max_tokens),
        request.sampling, request.logprobs, request.logprobs ? request.top_logprobs : 0};
    generation.request_id = http_request.id;
    const std::string call_grammar =
        chat ? required_call_grammar(request, reading ? reading->format.family : chat::Family::None,
                                     prompt.opens_reasoning)
             : "";
    generation.grammar = call_grammar.empty() ? std::move(request.grammar) : call_grammar;

    auto session = std::make_shared<GenerationSession>(tokenizer_, std::move(request.stop),
                                                       request.logprobs, reading);
    if (request.stream && !generator_.waiting_for().empty()) {
      return stream(http_request, std::move(writer), prompt_usage, session, std::move(generation));
    }
    submit(std::move(generation), session);
    if (request.stream) return stream(http_request, std::move(writer), prompt_usage, session);
    return respond_when_done(http_request, *writer, prompt_usage, session);
  }

  // Each input is its own engine request, all submitted at once so that they run batched.
  http::Response handle_embeddings(const http::Request& http_request, EmbeddingDialect dialect) {
    const auto started = std::chrono::steady_clock::now();
    const EmbeddingRequest request = parse_embedding_request(dialect, http_request.body);
    check_model(request.model);
    const model::Pooling pooling = options_.embedding_pooling;
    if (pooling == model::Pooling::None || pooling == model::Pooling::Rank) {
      throw ApiError(400,
                     "The model '" + model_name_ + "' makes no embeddings: its GGUF declares " +
                         (pooling == model::Pooling::None ? std::string("no pooling type (<arch>.pooling_type)")
                                                          : std::string("rank pooling, which scores documents")) +
                         ". Serve an embedding model such as Qwen3-Embedding.",
                     "model", "model_not_supported");
    }
    if (request.dimensions && *request.dimensions > options_.embedding_dim) {
      throw ApiError(400,
                     "This model's embeddings have " + std::to_string(options_.embedding_dim) +
                         " dimensions; dimensions " + std::to_string(*request.dimensions) + " is more.",
                     "dimensions", "invalid_value");
    }
    const int context = generator_.limits().context_size;
    std::vector<std::vector<engine::Token>> prompts;
    int prompt_tokens = 0;
    for (size_t i = 0; i < request.inputs.size(); ++i) {
      std::vector<engine::Token> tokens;
      if (const auto* text = std::get_if<std::string>(&request.inputs[i])) {
        tokens = embedding_tokens(*text, context, request.truncate);
      } else {
        tokens = std::get<std::vector<engine::Token>>(request.inputs[i]);
      }
      if (static_cast<int64_t>(tokens.size()) > context) {
        if (!request.truncate) {
          throw ApiError(400,
                         "This model's maximum context length is " + std::to_string(context) + " tokens, but input " +
                             std::to_string(i) + " has " + std::to_string(tokens.size()) +
                             ". Please reduce the length of the input.",
                         "input", "context_length_exceeded");
        }
        tokens.resize(static_cast<size_t>(context));
      }
      prompt_tokens += static_cast<int>(tokens.size());
      prompts.push_back(std::move(tokens));
    }
    auto pending = std::make_shared<PendingEmbeddings>(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      engine::GenerationRequest generation;
      generation.prompt = std::move(prompts[i]);
      generation.max_tokens = 1;  // generates nothing; the wire's requests carry a budget
      generation.embedding = pooling;
      generation.request_id = http_request.id;
      // The inputs already submitted end at their next step when one is refused.
      submit_observed(std::move(generation), pending->callbacks(i), [&] { pending->cancel(); }, "input",
                      "invalid_value");
    }
    const ClientWatch client(http_request.socket);
    PendingEmbeddings::Outcome outcome = pending->wait([&]() -> std::optional<std::string> {
      if (stopping_) return "The server is shutting down.";
      if (client.gone()) return "the client went away";
      return std::nullopt;
    });
    if (!outcome.error.empty()) throw ApiError(stopping_ ? 503 : 500, outcome.error, {}, "generation_failed");
    for (auto& vector : outcome.vectors) vector = unit_embedding(std::move(vector), request.dimensions);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return json_response(embedding_response_body(request, model_name_, outcome.vectors, prompt_tokens, seconds));
  }

  // A text to embed as the model's tokenizer marks a whole text: bos (as prompts get it) and,
  // where the vocabulary says so, eos. Text far longer than the context is cut before it is
  // tokenized when it may be truncated, and refused when not, as prompts are.
  std::vector<engine::Token> embedding_tokens(std::string_view text, int context, bool truncate) const {
    const size_t most_bytes = size_t(context) * longest_token_bytes_;
    if (text.size() > most_bytes && !truncate) {
      throw ApiError(400,
                     "This model's maximum context length is " + std::to_string(context) + " tokens, and an input holds " +
                         std::to_string(text.size()) + " bytes of text, more than that many tokens can stand for.",
                     "input", "context_length_exceeded");
    }
    std::vector<engine::Token> tokens = completion_prompt_tokens(tokenizer_, text.substr(0, 2 * most_bytes));
    if (tokenizer_.add_eos_by_default() && (tokens.empty() || tokens.back() != tokenizer_.eos())) {
      tokens.push_back(tokenizer_.eos());
    }
    return tokens;
  }

  // How a chat answer is read: calls in the model's family's syntax when tools are offered (and
  // not refused with tool_choice "none"), reasoning where the template writes it. None where
  // there is nothing to read: the text is then all content, as before tools existed.
  std::optional<OutputReading> output_reading(const CompletionRequest& request, const ChatPrompt& prompt) const {
    chat::OutputFormat format;
    if (model_template_) {
      format.family = model_template_->family();
      format.think_tags = model_template_->think_tags();
    }
    format.starts_in_reasoning = prompt.opens_reasoning;
    format.parse_tool_calls = !request.tools.empty() && request.tool_choice.mode != ToolChoice::Mode::None &&
                              format.family != chat::Family::None;
    if (format.family == chat::Family::None && !format.think_tags && !format.starts_in_reasoning) return std::nullopt;
    return OutputReading{format, request.sampling.seed, !request.parallel_tool_calls};
  }

  void submit(engine::GenerationRequest generation,
              const std::shared_ptr<GenerationSession>& session) {
    track(session);
    submit_observed(std::move(generation), session->callbacks(), [&] { forget(session); }, {},
                    "context_length_exceeded");
  }

  // Submits with the request's metrics and log line. A refusal becomes the API's error, after
  // `refused` has undone what the caller prepared: 400 (with `invalid_param` and `invalid_code`)
  // for what the generator cannot run, 503 while nothing can run, 429 when its queue is full.
  void submit_observed(engine::GenerationRequest generation, engine::RequestCallbacks callbacks,
                       const std::function<void()>& refused, const std::string& invalid_param,
                       const std::string& invalid_code) {
    bool accepted = false;
    try {
      const int prompt_size = static_cast<int>(generation.prompt.size());
      const std::string id = generation.request_id;
      accepted = generator_.submit(std::move(generation), observed(std::move(callbacks), prompt_size, id, log_));
    } catch (const std::invalid_argument& error) {
      refused();
      throw ApiError(400, error.what(), invalid_param, invalid_code);
    } catch (const engine::Unavailable& error) {
      refused();
      ApiError unavailable(503, error.what(), {}, "model_unavailable");
      unavailable.retry_after_seconds = error.retry_after_seconds;
      throw unavailable;
    } catch (...) {
      refused();
      throw;
    }
    if (!accepted) {
      refused();
      throw ApiError(429, "Too many requests are waiting for the model; retry later.", {},
                     "queue_full");
    }
  }

  ApiError outcome_error(const GenerationOutcome& outcome) const {
    return ApiError(stopping_ ? 503 : 500, outcome.error, {}, "generation_failed");
  }

  // Nothing is written while a request waits for the model, so a client that goes away is only
  // seen by looking at its connection: within kClientCheck the generation is cancelled, and its
  // sequence released or its place in the queue given up.
  static GenerationSession::Update next_update(GenerationSession& session,
                                               const ClientWatch& client) {
    constexpr std::chrono::milliseconds kClientCheck{100};
    while (true) {
      auto update = session.wait_for(kClientCheck);
      if (!update.outcome && client.gone()) session.cancel();
      if (!update.delta.empty() || update.outcome) return update;
    }
  }

  http::Response respond_when_done(const http::Request& http_request, ResponseWriter& writer,
                                   Usage usage, const std::shared_ptr<GenerationSession>& session) {
    const ClientWatch client(http_request.socket);
    TextDelta output;
    std::optional<GenerationOutcome> outcome;
    while (!outcome) {
      auto update = next_update(*session, client);
      output.append(std::move(update.delta));
      outcome = std::move(update.outcome);
    }
    forget(session);
    if (outcome->kind == GenerationOutcome::Kind::Error) throw outcome_error(*outcome);
    usage.completion_tokens = session->completion_tokens();
    usage.reasoning_tokens = session->reasoning_tokens();
    usage.cached_tokens = session->cached_tokens();
    usage.accepted_prediction_tokens = session->drafts_accepted();
    usage.rejected_prediction_tokens = session->drafts_rejected();
    usage.first_token_at = session->first_token_at();
    http::Response response;
    response.content_type = writer.content_type(false);
    response.body = writer.whole(output, finish_of(*outcome, *session), usage);
    return response;
  }

  // `unsubmitted`: a request that waits for the model to be ready. Meanwhile the stream sends
  // an SSE comment line a second saying what it waits for, so that neither the client nor a
  // proxy takes the silence for a hang; after the startup wait it ends with a 503 error event.
  http::Response stream(const http::Request& http_request, std::shared_ptr<ResponseWriter> writer,
                        Usage usage, const std::shared_ptr<GenerationSession>& session,
                        std::optional<engine::GenerationRequest> unsubmitted = std::nullopt) {
    http::Response response;
    response.content_type = writer->content_type(true);
    response.headers.emplace_back("Cache-Control", "no-cache");
    if (unsubmitted) track(session);  // a server that stops ends the wait too
    response.next_piece = [this, writer, usage, session, client = ClientWatch(http_request.socket),
                           unsubmitted = std::move(unsubmitted),
                           wait_ends = std::chrono::steady_clock::now() + options_.startup_wait,
                           started = false, done = false]() mutable -> std::optional<std::string> {
      if (done) return std::nullopt;
      if (unsubmitted) {
        std::string why = generator_.waiting_for();
        // A line a second, but the request goes on as soon as the model can run it.
        for (int tick = 0; started && tick < 10 && !why.empty(); ++tick) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          why = generator_.waiting_for();
        }
        if (!why.empty() && !stopping_) {
          if (client.gone()) return std::nullopt;
          if (std::chrono::steady_clock::now() >= wait_ends) {
            done = true;
            forget(session);
            return writer->stream_error(model_not_ready(why));
          }
          started = true;
          return writer->stream_waiting(why);
        }
        try {
          submit(std::move(*unsubmitted), session);
          unsubmitted.reset();
        } catch (const ApiError& error) {
          done = true;
          return writer->stream_error(error);
        }
        started = false;
      }
      if (!started) {
        started = true;
        return writer->stream_start(usage);
      }
      auto update = next_update(*session, client);
      std::string events;
      if (!update.delta.empty()) events += writer->stream_delta(update.delta);
      if (update.outcome) {
        done = true;
        if (update.outcome->kind == GenerationOutcome::Kind::Error) {
          events += writer->stream_error(outcome_error(*update.outcome));
        } else {
          usage.completion_tokens = session->completion_tokens();
          usage.reasoning_tokens = session->reasoning_tokens();
          usage.cached_tokens = session->cached_tokens();
          usage.accepted_prediction_tokens = session->drafts_accepted();
          usage.rejected_prediction_tokens = session->drafts_rejected();
          usage.first_token_at = session->first_token_at();
          events += writer->stream_end(finish_of(*update.outcome, *session), usage);
        }
      }
      return events;
    };
    response.on_stream_end = [this, session](bool whole) {
      if (!whole) session->cancel();
      forget(session);
    };
    return response;
  }

  void track(const std::shared_ptr<GenerationSession>& session) {
    std::lock_guard lock(sessions_mutex_);
    if (stopping_) session->abandon();
    sessions_.insert(session);
  }

  void forget(const std::shared_ptr<GenerationSession>& session) {
    {
      std::lock_guard lock(sessions_mutex_);
      sessions_.erase(session);
    }
    sessions_ended_.notify_all();
  }

  engine::Generator& generator_;
  const tokenizer::Tokenizer& tokenizer_;
  const std::string model_name_;
  const std::string chat_template_;
  const std::optional<ModelChatTemplate> model_template_;  // none: ChatML
  const size_t longest_token_bytes_;
  const ServerOptions options_;
  const std::function<void(const std::string&)> log_;
  const int64_t created_;
  std::vector<Route> routes_;
  std::atomic<bool> stopping_{false};
  std::mutex sessions_mutex_;
  std::set<std::shared_ptr<GenerationSession>> sessions_;
  std::condition_variable sessions_ended_;
  int port_ = -1;
  http::Server http_;  // last: its threads call into everything above
};

Server::Server(engine::Generator& generator, const tokenizer::Tokenizer& tokenizer,
               std::string model_name, std::string chat_template, ServerOptions options)
    : impl_(std::make_unique<Impl>(generator, tokenizer, std::move(model_name), chat_template,
                                   std::move(options))) {}

Server::~Server() = default;
void Server::start() { impl_->start(); }
int Server::port() const { return impl_->port(); }
void Server::stop() { impl_->stop(); }

class WaitingServer::Impl final : public http::Service {
 public:
  Impl(ServerOptions options, std::function<std::string()> waiting_for)
      : options_(std::move(options)),
        waiting_for_(std::move(waiting_for)),
        http_(http_options(options_, kMinHttpThreads), *this),
        port_(http_.start()) {}

  int port() const { return port_; }

  http::Response handle(const http::Request& request) override {
    if (request.method == "GET" && request.path == "/health") {
      http::Response response;
      response.status = 503;
      response.body = nlohmann::json{{"status", "waiting"}, {"waiting_for", waiting_for_()}}.dump();
      return sent(options_, request, std::move(response));
    }
    try {
      check_api_key(options_, request);
    } catch (const ApiError& refused) {
      return sent(options_, request, error_response(request, refused));
    }
    return sent(options_, request, error_response(request, model_not_ready(waiting_for_())));
  }

  http::Response refuse(const http::Request& request, int status, const std::string& message) override {
    return error_response(request, ApiError(status, message, {}, refusal_code(status)));
  }

 private:
  const ServerOptions options_;
  const std::function<std::string()> waiting_for_;
  http::Server http_;  // its threads call into the members above
  const int port_;
};

WaitingServer::WaitingServer(const ServerOptions& options, std::function<std::string()> waiting_for)
    : impl_(std::make_unique<Impl>(options, std::move(waiting_for))) {}

WaitingServer::~WaitingServer() = default;
int WaitingServer::port() const { return impl_->port(); }

std::string model_name_from_path(const std::string& model_path) {
  std::filesystem::path path(model_path);
  return path.extension() == ".gguf" ? path.stem().string() : path.filename().string();
}

namespace {
constexpr int kMmapThresholdBytes = 256 << 10;
std::atomic<int> received_signal{0};
extern "C" void remember_signal(int signal) { received_signal = signal; }

}  // namespace

void request_stop() { received_signal = SIGTERM; }

void serve_until_signal(engine::Generator& generator, const tokenizer::Tokenizer& tokenizer,
                        const gguf::File& model, const ServerOptions& options) {
  // Request bodies of megabytes are freed back to the system when a request ends: without a
  // fixed threshold glibc raises it after the first such free and keeps the memory. A block
  // above it is fresh pages each time, so what a decode step needs of a vocabulary's size is
  // kept from step to step (the stage's logits rows, the sampler's scratch).
  mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes);
  // Every connection is a descriptor; the usual soft limit of 1024 is below the connection cap.
  rlimit descriptors{};
  if (getrlimit(RLIMIT_NOFILE, &descriptors) == 0 && descriptors.rlim_cur < descriptors.rlim_max) {
    descriptors.rlim_cur = descriptors.rlim_max;
    setrlimit(RLIMIT_NOFILE, &descriptors);
  }
  // A template given to serve replaces the GGUF's, its tool_use alternative too.
  ServerOptions with_templates = options;
  if (!options.chat_template)
    with_templates.tool_use_chat_template = model.get_string("tokenizer.chat_template.tool_use").value_or("");
  Server server(generator, tokenizer, model_name_from_path(model.path()),
                options.chat_template.value_or(model.get_string("tokenizer.chat_template").value_or("")),
                with_templates);
  server.start();
  const auto log = request_log(options);
  log("serving " + model_name_from_path(model.path()) + " on http://" + options.host + ":" +
      std::to_string(server.port()));
  if (options.on_listening) options.on_listening(server.port());
  received_signal = 0;
  auto previous_interrupt = std::signal(SIGINT, remember_signal);
  auto previous_terminate = std::signal(SIGTERM, remember_signal);
  while (received_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // A second signal while the node leaves its cluster ends the process at once.
  std::signal(SIGINT, previous_interrupt);
  std::signal(SIGTERM, previous_terminate);
  if (options.on_stopping) options.on_stopping();
  log("stopping the server");
  server.stop();
}

}  // namespace strata::api
