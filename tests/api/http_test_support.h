// Helpers shared by the HTTP tests.
#pragma once

#include <httplib.h>

#include <string>

namespace strata::api::testing {

// POSTs a streaming `body` to `path`, reads `chunks` pieces of the reply and then closes the
// connection, as a client that goes away mid-stream does. Returns how many pieces arrived.
inline int post_and_hang_up(httplib::Client& client, const std::string& path, const std::string& body,
                            int chunks) {
  httplib::Request request;
  request.method = "POST";
  request.path = path;
  request.body = body;
  request.set_header("Content-Type", "application/json");
  int received = 0;
  request.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++received < chunks; };
  client.send(request);
  return received;
}

}  // namespace strata::api::testing
