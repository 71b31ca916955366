#include "api/server.h"

#include <httplib.h>

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
#include <set>
#include <stdexcept>
#include <thread>

#include "api/api_error.h"
#include "api/chat_template.h"
#include "api/client_watch.h"
#include "api/generation_session.h"
#include "api/request.h"
#include "api/responses.h"
#include "engine/generator.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

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

// Ollama's clients expect its error shape on its endpoints.
void send_error(const httplib::Request& request, httplib::Response& response,
                const ApiError& error) {
  response.status = error.status;
  const bool ollama = request.path.starts_with("/api/");
  response.set_content(ollama ? ollama_error_body(error) : openai_error_body(error),
                       "application/json");
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
  for (const auto& message : request.messages) bytes += message.content.size();
  return bytes;
}

std::string_view finish_reason(const GenerationOutcome& outcome) {
  return outcome.kind == GenerationOutcome::Kind::Length ? "length" : "stop";
}

}  // namespace

class Server::Impl {
 public:
  Impl(engine::Generator& generator, const tokenizer::Tokenizer& tokenizer, std::string model_name,
       std::string_view chat_template, ServerOptions options)
      : generator_(generator),
        tokenizer_(tokenizer),
        model_name_(std::move(model_name)),
        template_family_(detect_template_family(chat_template)),
        longest_token_bytes_(longest_token_bytes(tokenizer)),
        options_(std::move(options)),
        created_(unix_time()) {
    if (options_.api_key && options_.api_key->empty()) {
      throw std::invalid_argument("The API key is empty; leave it unset to serve without one.");
    }
    configure();
  }

  ~Impl() { stop(); }

  void start() {
    port_ = options_.port == 0
                ? http_.bind_to_any_port(options_.host)
                : (http_.bind_to_port(options_.host, options_.port) ? options_.port : -1);
    if (port_ <= 0) {
      throw std::runtime_error("cannot listen on " + options_.host + ":" +
                               std::to_string(options_.port));
    }
    // httplib listens with a backlog of 5, which drops connections when many clients arrive at
    // once; listening again on the same socket raises it.
    if (listening_socket_ != INVALID_SOCKET) ::listen(listening_socket_, SOMAXCONN);
    listener_ = std::thread([this] { http_.listen_after_bind(); });
  }

  int port() const { return port_; }

  void stop() {
    {
      std::unique_lock lock(sessions_mutex_);
      stopping_ = true;
      for (const auto& session : sessions_) session->abandon();
      // Let each answer in flight end with its error before the sockets close: once stopped,
      // httplib no longer calls a stream's provider, and a stream that had not sent its first
      // event yet would end empty. A client that does not read gets kStopGrace.
      constexpr std::chrono::seconds kStopGrace{5};
      sessions_ended_.wait_for(lock, kStopGrace, [&] { return sessions_.empty(); });
    }
    http_.stop();
    if (listener_.joinable()) listener_.join();
  }

 private:
  void configure() {
    // Every running or queued request holds an HTTP thread while it waits for tokens; the spare
    // ones keep /health and errors answering when the engine is full.
    const auto limits = generator_.limits();
    const auto threads = std::clamp<int64_t>(int64_t{limits.max_parallel} + limits.max_queued + 4,
                                             kMinHttpThreads, kMaxHttpThreads);
    http_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http_.set_payload_max_length(options_.max_body_bytes);
    http_.set_socket_options([this](socket_t socket) {
      httplib::default_socket_options(socket);
      listening_socket_ = socket;
    });
    if (options_.log_requests) {
      http_.set_logger([](const httplib::Request& request, const httplib::Response& response) {
        std::fprintf(stderr, "strata: %s %s %s %d\n", request.remote_addr.c_str(),
                     request.method.c_str(), request.path.c_str(), response.status);
      });
    }
    http_.set_pre_routing_handler(
        [this](const httplib::Request& request, httplib::Response& response) {
          return admit(request, response);
        });
    http_.set_error_handler(httplib::Server::HandlerWithResponse(
        [this](const httplib::Request& request, httplib::Response& response) {
          if (!response.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
          send_error(request, response, status_error(request, response.status));
          return httplib::Server::HandlerResponse::Handled;
        }));
    http_.set_exception_handler(
        [](const httplib::Request& request, httplib::Response& response, std::exception_ptr error) {
          std::string message = "Internal error.";
          try {
            std::rethrow_exception(error);
          } catch (const std::exception& e) {
            message = std::string("Internal error: ") + e.what();
          } catch (...) {
          }
          send_error(request, response, ApiError(500, message));
        });

    http_.Get("/health", [](const httplib::Request&, httplib::Response& response) {
      response.set_content(R"({"status":"ok"})", "application/json");
    });
    http_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& response) {
      response.set_content(openai_models_body(model_name_, created_), "application/json");
    });
    http_.Get(
        R"(/v1/models/(.+))", [this](const httplib::Request& request, httplib::Response& response) {
          try {
            check_model(request.matches[1].str());
            response.set_content(openai_model_body(model_name_, created_), "application/json");
          } catch (const ApiError& error) {
            send_error(request, response, error);
          }
        });
    http_.Post("/v1/chat/completions",
               [this](const httplib::Request& request, httplib::Response& response) {
                 handle_completion(request, response, [&] {
                   auto parsed = parse_completion_request(Endpoint::ChatCompletions, request.body);
                   return std::pair(parsed, openai_writer(parsed));
                 });
               });
    http_.Post("/v1/completions",
               [this](const httplib::Request& request, httplib::Response& response) {
                 handle_completion(request, response, [&] {
                   auto parsed = parse_completion_request(Endpoint::Completions, request.body);
                   return std::pair(parsed, openai_writer(parsed));
                 });
               });
    http_.Get("/api/tags", [this](const httplib::Request&, httplib::Response& response) {
      response.set_content(ollama_tags_body(model_name_), "application/json");
    });
    for (auto [path, endpoint] : {std::pair("/api/chat", OllamaEndpoint::Chat),
                                  std::pair("/api/generate", OllamaEndpoint::Generate)}) {
      http_.Post(path,
                 [this, endpoint](const httplib::Request& request, httplib::Response& response) {
                   handle_completion(request, response, [&] {
                     auto parsed = parse_ollama_request(endpoint, request.body);
                     return std::pair(parsed, ollama_response_writer(endpoint, model_name_));
                   });
                 });
    }
  }

  httplib::Server::HandlerResponse admit(const httplib::Request& request,
                                         httplib::Response& response) {
    if (stopping_) {
      send_error(request, response, ApiError(503, "The server is shutting down."));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (options_.api_key && request.path != "/health") {
      if (!same_secret(bearer_credentials(request.get_header_value("Authorization")),
                       *options_.api_key)) {
        send_error(request, response,
                   ApiError(401,
                            "Incorrect or missing API key. Send it as "
                            "\"Authorization: Bearer <key>\".",
                            {}, "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    return httplib::Server::HandlerResponse::Unhandled;
  }

  ApiError status_error(const httplib::Request& request, int status) const {
    switch (status) {
      case 404:
        return ApiError(404, "Unknown endpoint: " + request.method + " " + request.path, {},
                        "unknown_url");
      case 413:
        return ApiError(413,
                        "The request body is larger than " +
                            std::to_string(options_.max_body_bytes) + " bytes.",
                        {}, "request_too_large");
      default:
        return ApiError(status,
                        "The request could not be handled (HTTP " + std::to_string(status) + ").");
    }
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

  std::unique_ptr<ResponseWriter> openai_writer(const CompletionRequest& request) const {
    return openai_response_writer(
        {request.endpoint, model_name_, request.logprobs, request.include_usage});
  }

  // `parse` reads the body in one of the dialects and picks the writer for its answer.
  using Parse = std::function<std::pair<CompletionRequest, std::unique_ptr<ResponseWriter>>()>;

  void handle_completion(const httplib::Request& http_request, httplib::Response& response,
                         const Parse& parse) {
    try {
      auto [request, writer] = parse();
      check_model(request.model);
      check_prompt_size(request);
      const bool chat = request.endpoint == Endpoint::ChatCompletions;
      std::vector<engine::Token> prompt =
          chat ? chat_prompt_tokens(tokenizer_, template_family_, request.messages)
               : completion_prompt_tokens(tokenizer_, request.prompt);
      const Usage prompt_usage{static_cast<int>(prompt.size()), 0};
      engine::GenerationRequest generation{
          std::move(prompt),
          completion_budget(request.endpoint, prompt_usage.prompt_tokens, request.max_tokens),
          request.sampling, request.logprobs, request.logprobs ? request.top_logprobs : 0};

      auto session = std::make_shared<GenerationSession>(tokenizer_, std::move(request.stop),
                                                         request.logprobs);
      submit(std::move(generation), session);
      if (request.stream) {
        stream(std::move(writer), prompt_usage, session, response);
      } else {
        respond_when_done(http_request, *writer, prompt_usage, session, response);
      }
    } catch (const ApiError& error) {
      send_error(http_request, response, error);
    }
  }

  void submit(engine::GenerationRequest generation,
              const std::shared_ptr<GenerationSession>& session) {
    track(session);
    bool accepted = false;
    try {
      accepted = generator_.submit(std::move(generation), session->callbacks());
    } catch (const std::invalid_argument& error) {
      forget(session);
      throw ApiError(400, error.what(), {}, "context_length_exceeded");
    } catch (...) {
      forget(session);
      throw;
    }
    if (!accepted) {
      forget(session);
      throw ApiError(429, "Too many requests are waiting for the model; retry later.", {},
                     "queue_full");
    }
  }

  ApiError outcome_error(const GenerationOutcome& outcome) const {
    return ApiError(stopping_ ? 503 : 500, outcome.error, {}, "generation_failed");
  }

  // Nothing is written before the answer is whole, so a client that goes away is only seen
  // by looking at its connection: within kClientCheck the generation is cancelled and its
  // sequence released, as a closed stream's is.
  void respond_when_done(const httplib::Request& http_request, ResponseWriter& writer, Usage usage,
                         const std::shared_ptr<GenerationSession>& session,
                         httplib::Response& response) {
    constexpr std::chrono::milliseconds kClientCheck{100};
    const auto look_from = std::chrono::steady_clock::now() + kClientCheck;
    std::optional<ClientWatch> client;  // found only for answers that take a while
    TextDelta output;
    std::optional<GenerationOutcome> outcome;
    while (!outcome) {
      auto update = session->wait_for(kClientCheck);
      output.append(std::move(update.delta));
      outcome = std::move(update.outcome);
      if (outcome || std::chrono::steady_clock::now() < look_from) continue;
      if (!client) {
        client.emplace(http_request.local_addr, http_request.local_port, http_request.remote_addr,
                       http_request.remote_port);
      }
      if (client->gone()) session->cancel();
    }
    forget(session);
    if (outcome->kind == GenerationOutcome::Kind::Error) throw outcome_error(*outcome);
    usage.completion_tokens = session->completion_tokens();
    usage.first_token_at = session->first_token_at();
    response.set_content(writer.whole(output, finish_reason(*outcome), usage),
                         std::string(writer.content_type(false)));
  }

  void stream(std::shared_ptr<ResponseWriter> writer, Usage usage,
              const std::shared_ptr<GenerationSession>& session, httplib::Response& response) {
    auto started = std::make_shared<bool>(false);
    response.set_header("Cache-Control", "no-cache");
    response.set_chunked_content_provider(
        std::string(writer->content_type(true)),
        [this, writer, usage, session, started](size_t, httplib::DataSink& sink) mutable {
          std::string events;
          bool done = false;
          if (!*started) {
            events = writer->stream_start();
            *started = true;
          } else {
            auto update = session->wait();
            if (!update.delta.empty()) events += writer->stream_delta(update.delta);
            if (update.outcome) {
              done = true;
              if (update.outcome->kind == GenerationOutcome::Kind::Error) {
                events += writer->stream_error(outcome_error(*update.outcome));
              } else {
                usage.completion_tokens = session->completion_tokens();
    usage.first_token_at = session->first_token_at();
                events += writer->stream_end(finish_reason(*update.outcome), usage);
              }
            }
          }
          // An empty write would end the chunked body early.
          if (!events.empty() && !sink.write(events.data(), events.size())) {
            session->cancel();
            return false;
          }
          if (done) sink.done();
          return true;
        },
        [this, session](bool success) {
          if (!success) session->cancel();
          forget(session);
        });
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
  const TemplateFamily template_family_;
  const size_t longest_token_bytes_;
  const ServerOptions options_;
  const int64_t created_;
  httplib::Server http_;
  std::thread listener_;
  int port_ = -1;
  socket_t listening_socket_ = INVALID_SOCKET;
  std::atomic<bool> stopping_{false};
  std::mutex sessions_mutex_;
  std::set<std::shared_ptr<GenerationSession>> sessions_;
  std::condition_variable sessions_ended_;
};

Server::Server(engine::Generator& generator, const tokenizer::Tokenizer& tokenizer,
               std::string model_name, std::string chat_template, ServerOptions options)
    : impl_(std::make_unique<Impl>(generator, tokenizer, std::move(model_name), chat_template,
                                   std::move(options))) {}

Server::~Server() = default;
void Server::start() { impl_->start(); }
int Server::port() const { return impl_->port(); }
void Server::stop() { impl_->stop(); }

std::string model_name_from_path(const std::string& model_path) {
  std::filesystem::path path(model_path);
  return path.extension() == ".gguf" ? path.stem().string() : path.filename().string();
}

namespace {
std::atomic<int> received_signal{0};
extern "C" void remember_signal(int signal) { received_signal = signal; }
}  // namespace

void serve_until_signal(engine::Generator& generator, const tokenizer::Tokenizer& tokenizer,
                        const gguf::File& model, const ServerOptions& options) {
  Server server(generator, tokenizer, model_name_from_path(model.path()),
                model.get_string("tokenizer.chat_template").value_or(""), options);
  server.start();
  std::fprintf(stderr, "strata: serving %s on http://%s:%d\n",
               model_name_from_path(model.path()).c_str(), options.host.c_str(), server.port());
  received_signal = 0;
  auto previous_interrupt = std::signal(SIGINT, remember_signal);
  auto previous_terminate = std::signal(SIGTERM, remember_signal);
  while (received_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::signal(SIGINT, previous_interrupt);
  std::signal(SIGTERM, previous_terminate);
  std::fprintf(stderr, "strata: stopping the server\n");
  server.stop();
}

}  // namespace strata::api
