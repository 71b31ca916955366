// Request bodies read as one JSON object, with the limits every endpoint shares.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace strata::api {

// Keys stay in the client's order: tools and their schemas reach the chat template so. Throws
// ApiError (400, code invalid_json) for a body that is not JSON, not an object, nested deeper
// or with objects of more members than any real request has: refusing those while parsing
// keeps a body of brackets from costing seconds and hundreds of megabytes, and a huge object
// from costing minutes (an ordered object finds a key by a linear search).
nlohmann::ordered_json parse_ordered_json_object(std::string_view body);

// Readers of the bodies that other APIs translate into a chat request; their 400s name the field
// by its path, as "messages.0.content.1".
[[noreturn]] void invalid_field(const std::string& path, const std::string& why);
// The member `key` of an object, or null when it has none: a reference, never a copy.
const nlohmann::ordered_json& member(const nlohmann::ordered_json& object, const char* key);
const nlohmann::ordered_json& expect_array(const nlohmann::ordered_json& value, const std::string& path);
const nlohmann::ordered_json& expect_object(const nlohmann::ordered_json& value, const std::string& path);
const std::string& expect_string(const nlohmann::ordered_json& value, const std::string& path);
bool expect_bool(const nlohmann::ordered_json& value, const std::string& path);
// An object's "type" string, which content blocks and items have.
const std::string& type_of(const nlohmann::ordered_json& object, const std::string& path);
// Content given as a string or a list of text parts of the given types ({"type", "text"}), as
// OpenAI's chat content: the string, or {"type": "text", "text"} parts. Any other part is a 400
// saying the model reads text only.
nlohmann::ordered_json text_content(const nlohmann::ordered_json& content, const std::string& path,
                                    std::initializer_list<std::string_view> text_types);
[[noreturn]] void not_text(const std::string& path, const std::string& type);

}  // namespace strata::api
