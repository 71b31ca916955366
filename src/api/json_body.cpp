#include "api/json_body.h"

#include <string>

#include "api/api_error.h"

namespace strata::api {
namespace {

constexpr int kMaxJsonDepth = 64;

template <class Json>
Json parse_object(std::string_view body) {
  Json root;
  try {
    root = Json::parse(body, [](int depth, typename Json::parse_event_t, Json&) {
      if (depth > kMaxJsonDepth) {
        throw ApiError(400,
                       "The request body is nested more than " + std::to_string(kMaxJsonDepth) +
                           " levels deep.",
                       {}, "invalid_json");
      }
      return true;
    });
  } catch (const nlohmann::json::exception& error) {  // parse_error, or out_of_range for huge numbers
    throw ApiError(400, std::string("The request body is not valid JSON: ") + error.what(), {},
                   "invalid_json");
  }
  if (!root.is_object()) {
    throw ApiError(400, "The request body must be a JSON object.", {}, "invalid_json");
  }
  return root;
}

}  // namespace

nlohmann::json parse_json_object(std::string_view body) { return parse_object<nlohmann::json>(body); }

nlohmann::ordered_json parse_ordered_json_object(std::string_view body) {
  return parse_object<nlohmann::ordered_json>(body);
}

}  // namespace strata::api
