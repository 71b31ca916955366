// Request bodies read as one JSON object, with the limits every endpoint shares.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

namespace strata::api {

// Throws ApiError (400, code invalid_json) for a body that is not JSON, not an object, or
// nested deeper than any real request is: refusing that while parsing keeps a body of brackets
// from costing seconds and hundreds of megabytes.
nlohmann::json parse_json_object(std::string_view body);
// The same, keeping every object's keys in the client's order (tool schemas reach the prompt so).
nlohmann::ordered_json parse_ordered_json_object(std::string_view body);

}  // namespace strata::api
