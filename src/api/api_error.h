// An error the client caused or must hear about, carried to the HTTP layer as OpenAI's error
// object.
#pragma once

#include <stdexcept>
#include <string>

namespace strata::api {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = {}, std::string code = {},
           std::string type = {})
      : std::runtime_error(message),
        status(status),
        param(std::move(param)),
        code(std::move(code)),
        type(type.empty() ? default_type(status) : std::move(type)) {}

  int status;
  int retry_after_seconds = 0;  // sent as Retry-After when positive
  std::string param;  // empty: null in the JSON
  std::string code;   // empty: null in the JSON
  std::string type;

 private:
  static std::string default_type(int status) {
    switch (status) {
      case 401:
        return "authentication_error";
      case 404:
        return "not_found_error";
      case 429:
        return "rate_limit_error";
      default:
        return status >= 500 ? "server_error" : "invalid_request_error";
    }
  }
};

}  // namespace strata::api
