// What the HTTP transport allows a client: sizes, deadlines and connections.
#pragma once

#include <chrono>
#include <cstddef>

namespace strata::api::http {

struct Limits {
  size_t max_body_bytes = size_t{8} << 20;  // after chunked framing is removed
  size_t max_header_bytes = size_t{16} << 10;
  size_t max_header_fields = 100;
  // From a connection's start, or the end of its previous answer, to a whole request header.
  std::chrono::milliseconds header_timeout{10'000};
  std::chrono::milliseconds body_timeout{30'000};   // for the whole body, once the header is in
  std::chrono::milliseconds write_timeout{30'000};  // for each write of an answer
  // Beyond these a new connection takes the place of the oldest one that has no request being
  // answered; when every one has, the new one gets 503.
  // Well above what one busy client machine opens (a load test of 64 clients, whose closed
  // connections the server may not have seen end yet), well below the descriptors there are.
  size_t max_connections = 1024;
  size_t max_connections_per_client = 256;  // per client IP address
};

}  // namespace strata::api::http
