// JSON schemas (the subset that response_format and Ollama's format need) compiled into GBNF
// text whose sentences are the JSON texts the schema accepts, written compactly or with a
// little whitespace. See docs/API.md for the keywords supported and the choices made. Schemas
// are ordered_json, because objects' properties are written in the schema's order.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata::constrain {

// Thrown for a schema that is invalid or uses what is not supported; the message names the
// keyword and where it is (a JSON pointer into the schema).
struct SchemaError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// GBNF whose root accepts exactly the JSON values (bounded as docs/API.md says) matching the
// schema. Throws SchemaError.
std::string json_schema_grammar(const nlohmann::ordered_json& schema);

// GBNF accepting any JSON object: response_format {"type": "json_object"}, Ollama's "json".
std::string json_object_grammar();

// `prefix`, then a JSON value matching `schema`, then `suffix`: e.g. a tool call's wrapping
// around its arguments' schema.
struct WrappedSchema {
  std::string prefix;
  nlohmann::ordered_json schema;
  std::string suffix;
};
// GBNF accepting any one of the alternatives. Throws SchemaError (also for none).
std::string wrapped_json_grammar(const std::vector<WrappedSchema>& alternatives);

}  // namespace strata::constrain
