#include "api/http_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <list>
#include <future>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

namespace strata::api::http {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = net::ip::tcp;

// Reading and writing sockets is cheap; the work happens on the workers.
constexpr int kIoThreads = 2;

bool is_ip_literal(std::string_view host) {
  boost::system::error_code error;
  net::ip::make_address(std::string(host), error);
  return !error;
}

// The host part of a Host header: "name", "name:port", "1.2.3.4:port" or "[::1]:port".
std::string_view host_without_port(std::string_view host) {
  if (host.starts_with('[')) {
    const size_t end = host.find(']');
    return end == std::string_view::npos ? host : host.substr(1, end - 1);
  }
  const size_t colon = host.rfind(':');
  return colon == std::string_view::npos ? host : host.substr(0, colon);
}

// How the transport answers a read that failed: a status, or 0 to close without a word (the
// client went away, or let its deadline pass).
int status_for_read_error(const beast::error_code& error) {
  if (error == bhttp::error::header_limit) return 431;
  if (error == bhttp::error::body_limit) return 413;
  if (error.category() == bhttp::make_error_code(bhttp::error::bad_method).category() &&
      error != bhttp::error::end_of_stream && error != bhttp::error::partial_message) {
    return 400;  // the request is malformed
  }
  return 0;
}

std::string new_request_id() {
  thread_local std::mt19937_64 random(std::random_device{}());
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(random()));
  return text;
}

bool usable_request_id(std::string_view id) {
  return !id.empty() && id.size() <= 64 && std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' || c == '-';
  });
}

}  // namespace

std::string Request::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (beast::iequals(key, name)) return value;
  }
  return {};
}

struct Connection {
  Connection(tcp::socket socket, std::string client)
      : socket_handle(socket.native_handle()), stream(std::move(socket)), client(std::move(client)) {}

  const int socket_handle;
  beast::tcp_stream stream;
  const std::string client;
  // Guarded by Server::Impl::mutex_.
  bool answering = false;  // a whole request was read and its answer is not yet sent
  bool closing = false;
};

class Server::Impl {
 public:
  Impl(Options options, Service& service)
      : options_(std::move(options)),
        service_(service),
        acceptor_(net::make_strand(io_)),
        workers_(std::max<size_t>(options_.worker_threads, 1)) {}

  ~Impl() { stop(std::chrono::milliseconds(0)); }

  int start() {
    tcp::resolver resolver(io_);
    boost::system::error_code error;
    const auto endpoints = resolver.resolve(options_.host, std::to_string(options_.port),
                                            tcp::resolver::passive, error);
    if (!error && !endpoints.empty()) {
      const tcp::endpoint endpoint = endpoints.begin()->endpoint();
      acceptor_.open(endpoint.protocol(), error);
      if (!error) acceptor_.set_option(net::socket_base::reuse_address(true), error);
      if (!error) acceptor_.bind(endpoint, error);
      if (!error) acceptor_.listen(net::socket_base::max_listen_connections, error);
    }
    if (error || endpoints.empty()) {
      throw std::runtime_error("cannot listen on " + options_.host + ":" +
                               std::to_string(options_.port) +
                               (error ? ": " + error.message() : ""));
    }
    const int port = acceptor_.local_endpoint().port();
    net::co_spawn(acceptor_.get_executor(), accept_loop(), net::detached);
    for (int i = 0; i < kIoThreads; ++i) io_threads_.emplace_back([this] { io_.run(); });
    return port;
  }

  void stop(std::chrono::milliseconds grace) {
    if (io_threads_.empty() || stopping_.exchange(true)) return;
    // On the acceptor's strand, after which every accepted connection is registered.
    std::promise<void> acceptor_closed;
    net::post(acceptor_.get_executor(), [&] {
      acceptor_.close();
      acceptor_closed.set_value();
    });
    acceptor_closed.get_future().wait();
    // A connection the system accepted just before the close may resume the loop after it:
    // once the loop has ended, every connection is registered and is closed below, rather than
    // left unanswered until the server is destroyed.
    accepting_ended_.get_future().wait();
    {
      std::unique_lock lock(mutex_);
      for (const auto& connection : connections_) {
        if (!connection->answering) close(connection);
      }
      changed_.wait_for(lock, grace, [&] { return connections_.empty(); });
      for (const auto& connection : connections_) close(connection);
      // A closed socket fails its next read or write at once.
      changed_.wait_for(lock, std::chrono::seconds(2), [&] { return connections_.empty(); });
    }
    io_.stop();
    for (auto& thread : io_threads_) thread.join();
    workers_.join();
  }

 private:
  net::awaitable<void> accept_loop() {
    for (;;) {
      boost::system::error_code error;
      tcp::socket socket = co_await acceptor_.async_accept(
          net::make_strand(io_), net::redirect_error(net::use_awaitable, error));
      if (error) {
        if (!acceptor_.is_open()) {
          accepting_ended_.set_value();
          co_return;
        }
        // Out of file descriptors, most likely: give connections time to close.
        net::steady_timer pause(acceptor_.get_executor(), std::chrono::milliseconds(50));
        co_await pause.async_wait(net::redirect_error(net::use_awaitable, error));
        continue;
      }
      const std::string client = socket.remote_endpoint(error).address().to_string();
      auto connection = std::make_shared<Connection>(std::move(socket), client);
      net::co_spawn(connection->stream.get_executor(),
                    admit(connection) ? serve(connection) : refuse_connection(connection),
                    net::detached);
    }
  }

  // Registers the connection, making room by closing the oldest connections that have no
  // request being answered. False when there is no room: the connection is then registered as
  // closing, so that stop() waits for its refusal but no cap counts it.
  bool admit(const std::shared_ptr<Connection>& connection) {
    std::lock_guard lock(mutex_);
    const auto same_client = [&](const Connection& other) {
      return other.client == connection->client;
    };
    const auto anyone = [](const Connection&) { return true; };
    const bool room = !stopping_ &&
                      make_room(options_.limits.max_connections_per_client, same_client) &&
                      make_room(options_.limits.max_connections, anyone);
    connection->closing = !room;
    connections_.push_back(connection);
    return room;
  }

  template <class Predicate>
  bool make_room(size_t limit, Predicate counts) {
    size_t open = 0;
    for (const auto& other : connections_) open += !other->closing && counts(*other);
    for (auto it = connections_.begin(); open >= limit && it != connections_.end(); ++it) {
      if ((*it)->closing || (*it)->answering || !counts(**it)) continue;
      close(*it);
      --open;
    }
    return open < limit;
  }

  // Shuts the socket down on the connection's own strand, which makes its pending read or write
  // fail at once; the connection's coroutine then ends and closes it.
  void close(const std::shared_ptr<Connection>& connection) {
    connection->closing = true;
    net::post(connection->stream.get_executor(), [connection] {
      beast::error_code ignored;
      connection->stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    });
  }

  // Unregisters the connection when its coroutine ends, however it ends.
  struct Registration {
    Impl& server;
    std::shared_ptr<Connection> connection;
    ~Registration() {
      {
        std::lock_guard lock(server.mutex_);
        server.connections_.remove(connection);
      }
      server.changed_.notify_all();
    }
  };

  void set_answering(Connection& connection, bool answering) {
    std::lock_guard lock(mutex_);
    connection.answering = answering;
  }

  net::awaitable<void> serve(std::shared_ptr<Connection> connection) {
    Registration registration{*this, connection};
    beast::flat_buffer buffer;
    for (;;) {
      bhttp::request_parser<bhttp::string_body> parser;
      parser.header_limit(static_cast<uint32_t>(options_.limits.max_header_bytes));
      parser.body_limit(options_.limits.max_body_bytes);
      Request request;
      request.remote_address = connection->client;
      request.socket = connection->socket_handle;

      beast::error_code error;
      connection->stream.expires_after(options_.limits.header_timeout);
      co_await bhttp::async_read_header(connection->stream, buffer, parser,
                                        net::redirect_error(net::use_awaitable, error));
      describe(parser.get(), request);
      if (error) {
        const int status = status_for_read_error(error);
        if (status != 0) co_await send_refusal(*connection, request, status, error);
        co_return;
      }
      if (auto refusal = check_header(parser.get())) {
        co_await send(*connection, service_.refuse(request, refusal->first, refusal->second),
                      false);
        co_return;
      }
      if (beast::iequals(parser.get()[bhttp::field::expect], "100-continue")) {
        bhttp::response<bhttp::empty_body> proceed{bhttp::status::continue_, 11};
        connection->stream.expires_after(options_.limits.write_timeout);
        co_await bhttp::async_write(connection->stream, proceed,
                                    net::redirect_error(net::use_awaitable, error));
        if (error) co_return;
      }
      connection->stream.expires_after(options_.limits.body_timeout);
      co_await bhttp::async_read(connection->stream, buffer, parser,
                                 net::redirect_error(net::use_awaitable, error));
      connection->stream.expires_never();
      if (error) {
        const int status = status_for_read_error(error);
        if (status != 0) co_await send_refusal(*connection, request, status, error);
        co_return;
      }
      request.body = std::move(parser.get().body());
      const bool keep_alive = parser.get().keep_alive();

      set_answering(*connection, true);
      Response response = co_await on_workers([&] { return service_.handle(request); });
      const bool sent = co_await send(*connection, std::move(response), keep_alive && !stopping_);
      set_answering(*connection, false);
      if (!sent || !keep_alive || stopping_) co_return;
    }
  }

  net::awaitable<void> refuse_connection(std::shared_ptr<Connection> connection) {
    Registration registration{*this, connection};
    Request request;
    request.remote_address = connection->client;
    co_await send(*connection,
                  service_.refuse(request, 503,
                                  stopping_ ? "The server is shutting down."
                                            : "Too many connections are open; retry later."),
                  false);
  }

  net::awaitable<void> send_refusal(Connection& connection, const Request& request, int status,
                                    const beast::error_code& error) {
    std::string message;
    switch (status) {
      case 413:
        message = "The request body is larger than " +
                  std::to_string(options_.limits.max_body_bytes) + " bytes.";
        break;
      case 431:
        message = "The request header is larger than " +
                  std::to_string(options_.limits.max_header_bytes) + " bytes.";
        break;
      default:
        message = "The request is not valid HTTP/1.1: " + error.message() + ".";
    }
    co_await send(connection, service_.refuse(request, status, message), false);
  }

  static void describe(const bhttp::request<bhttp::string_body>& message, Request& request) {
    request.method = std::string(message.method_string());
    const std::string_view target = message.target();
    request.path = std::string(target.substr(0, target.find('?')));
    request.headers.clear();
    for (const auto& field : message) {
      request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
    const std::string given = request.header("x-request-id");
    request.id = usable_request_id(given) ? given : new_request_id();
  }

  // What the transport refuses once the header is in: a status and why.
  std::optional<std::pair<int, std::string>> check_header(
      const bhttp::request<bhttp::string_body>& message) const {
    const auto fields = static_cast<size_t>(std::distance(message.begin(), message.end()));
    if (fields > options_.limits.max_header_fields) {
      return std::pair(431, "The request has more than " +
                                std::to_string(options_.limits.max_header_fields) +
                                " header fields.");
    }
    const std::string_view encoding = message[bhttp::field::content_encoding];
    const std::string_view transfer = message[bhttp::field::transfer_encoding];
    if ((!encoding.empty() && !beast::iequals(encoding, "identity")) ||
        (!transfer.empty() && !beast::iequals(transfer, "chunked"))) {
      return std::pair(415, "Compressed request bodies are not accepted; send the body as is.");
    }
    const auto host = message.find(bhttp::field::host);
    if (host == message.end()) {
      if (message.version() >= 11) return std::pair(400, "HTTP/1.1 requests need a Host header.");
    } else if (!allowed_host(host_without_port(host->value()))) {
      return std::pair(403, "This server does not answer to the host name '" +
                                std::string(host_without_port(host->value())) + "'.");
    }
    return std::nullopt;
  }

  bool allowed_host(std::string_view host) const {
    if (host.ends_with('.')) host.remove_suffix(1);
    if (is_ip_literal(host) || beast::iequals(host, "localhost")) return true;
    return std::any_of(options_.host_names.begin(), options_.host_names.end(),
                       [&](const std::string& name) { return beast::iequals(host, name); });
  }

  // Runs `function` on a worker thread and resumes the caller on its own strand afterwards.
  template <class Function>
  net::awaitable<std::invoke_result_t<Function&>> on_workers(Function function) {
    // `function` stays in this frame, which waits for it.
    using Result = std::invoke_result_t<Function&>;
    co_return co_await net::co_spawn(
        workers_.get_executor(), [&function]() -> net::awaitable<Result> { co_return function(); },
        net::use_awaitable);
  }

  // Returns whether the whole answer was sent.
  net::awaitable<bool> send(Connection& connection, Response response, bool keep_alive) {
    bhttp::response<bhttp::string_body> head{static_cast<bhttp::status>(response.status), 11};
    head.set(bhttp::field::content_type, response.content_type);
    for (const auto& [name, value] : response.headers) head.insert(name, value);
    head.keep_alive(keep_alive);
    beast::error_code error;
    connection.stream.expires_after(options_.limits.write_timeout);
    if (!response.next_piece) {
      head.body() = std::move(response.body);
      head.prepare_payload();
      co_await bhttp::async_write(connection.stream, head,
                                  net::redirect_error(net::use_awaitable, error));
      connection.stream.expires_never();
      co_return !error;
    }
    head.chunked(true);
    bhttp::response_serializer<bhttp::string_body> serializer(head);
    co_await bhttp::async_write_header(connection.stream, serializer,
                                       net::redirect_error(net::use_awaitable, error));
    while (!error) {
      std::optional<std::string> piece = co_await on_workers([&] { return response.next_piece(); });
      if (!piece) {
        connection.stream.expires_after(options_.limits.write_timeout);
        co_await net::async_write(connection.stream, bhttp::make_chunk_last(),
                                  net::redirect_error(net::use_awaitable, error));
        break;
      }
      if (piece->empty()) continue;
      connection.stream.expires_after(options_.limits.write_timeout);
      co_await net::async_write(connection.stream, bhttp::make_chunk(net::buffer(*piece)),
                                net::redirect_error(net::use_awaitable, error));
    }
    connection.stream.expires_never();
    response.on_stream_end(!error);
    co_return !error;
  }

  const Options options_;
  Service& service_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::list<std::shared_ptr<Connection>> connections_;  // oldest first
  std::atomic<bool> stopping_{false};
  std::promise<void> accepting_ended_;  // the accept loop's, once the acceptor is closed
  // Destroyed before the registry above: the coroutines they end unregister themselves.
  net::io_context io_;
  tcp::acceptor acceptor_;
  net::thread_pool workers_;
  std::vector<std::thread> io_threads_;
};

Server::Server(Options options, Service& service)
    : impl_(std::make_unique<Impl>(std::move(options), service)) {}
Server::~Server() = default;
int Server::start() { return impl_->start(); }
void Server::stop(std::chrono::milliseconds grace) { impl_->stop(grace); }

}  // namespace strata::api::http
