// The HTTP/1.1 transport under the API, on Boost.Beast: it reads requests within deadlines and
// size limits, hands each whole request to a Service on a worker thread, and writes the answer
// back, whole or as a chunked stream. Slow, silent or hostile clients cost a socket each, never
// a thread, and are dropped when their deadline passes or when room is needed for others.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api/http_limits.h"

namespace strata::api::http {

struct Request {
  std::string method;
  std::string path;  // the target without its query
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string remote_address;
  int socket = -1;  // to see whether the client is still there while the answer is prepared
  // Names the request in logs and its answer's x-request-id: the client's own x-request-id
  // when it sent a usable one (1-64 of A-Z a-z 0-9 . _ : -), else a new random one.
  std::string id;

  // The first value of the header `name` (any case); empty when absent.
  std::string header(std::string_view name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // Set for a stream: called on a worker thread (it may block) for each next piece of the body,
  // which is sent as one chunk at once. Empty pieces are skipped; nullopt ends the body.
  std::function<std::optional<std::string>()> next_piece;
  // Set with next_piece: runs once the stream ended, with false when it could not be sent whole.
  std::function<void(bool whole)> on_stream_end;
};

class Service {
 public:
  virtual ~Service() = default;
  // Runs on a worker thread; may block until the answer is ready.
  virtual Response handle(const Request& request) = 0;
  // The answer for a request the transport refused (`request` holds what was read of it).
  virtual Response refuse(const Request& request, int status, const std::string& message) = 0;
};

struct Options {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  Limits limits;
  // Host header values (without port) answered besides IP literals and "localhost"; anything
  // else is refused with 403, so a web page cannot reach the server by DNS rebinding.
  std::vector<std::string> host_names;
  size_t worker_threads = 8;  // requests handled at once; more wait for a worker
};

class Server {
 public:
  Server(Options options, Service& service);
  ~Server();  // stops with no grace
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds, then serves on background threads. Returns the port. Throws std::runtime_error.
  int start();
  // Stops accepting and closes idle and unfinished connections at once; answers being written
  // get `grace` to finish. Returns when every connection is closed.
  void stop(std::chrono::milliseconds grace);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::api::http
