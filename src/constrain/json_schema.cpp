#include "constrain/json_schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "constrain/grammar.h"

namespace strata::constrain {

namespace {

using json = nlohmann::ordered_json;

// Keywords that only describe: accepted anywhere and ignored.
const std::set<std::string>& annotation_keywords() {
  static const std::set<std::string> names = {
      "title",    "description", "examples",  "default",         "$schema",         "$id",
      "$comment", "deprecated",  "readOnly",  "writeOnly",       "contentEncoding", "contentMediaType",
      "$anchor",  "$defs",       "definitions",
  };
  return names;
}

const std::set<std::string>& supported_keywords() {
  static const std::set<std::string> names = {
      "type",      "enum",      "const",    "properties", "required",         "additionalProperties",
      "items",     "minItems",  "maxItems", "minLength",  "maxLength",        "minimum",
      "maximum",   "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "$ref",
  };
  return names;
}

// Longest integer (digits) and fraction and exponent a generated number may have, so that a
// model cannot write digits forever. Between tokens goes at most one space: models that know
// JSON lose nothing by writing it compactly, and the others would pad it with whitespace.
constexpr int kIntegerDigits = 16;
constexpr int kFractionDigits = 16;
constexpr int kExponentDigits = 3;
constexpr int kMaxRepeat = 1000;  // parse_gbnf's bound on a repetition count
constexpr int kMaxDepth = 64;
const int64_t kLargestInteger = 9'999'999'999'999'999;  // kIntegerDigits nines

std::string literal(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20 || byte == 0x7F) {
      static const char* hex = "0123456789ABCDEF";
      out += "\\x";
      out += hex[byte >> 4];
      out += hex[byte & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string repeat(const std::string& item, int min, std::optional<int> max) {
  if (max && *max == 1 && min == 0) return item + "?";
  if (max && *max == min) return min == 1 ? item : item + "{" + std::to_string(min) + "}";
  return item + "{" + std::to_string(min) + "," + (max ? std::to_string(*max) : "") + "}";
}

// Decimal numbers of one length from `low` to `high` (digit strings of that length).
std::string same_length_range(const std::string& low, const std::string& high) {
  if (low.size() == 1) return low == high ? literal(low) : "[" + low + "-" + high + "]";
  const std::string low_rest = low.substr(1), high_rest = high.substr(1);
  if (low[0] == high[0]) return literal(low.substr(0, 1)) + " (" + same_length_range(low_rest, high_rest) + ")";
  const int rest = static_cast<int>(low_rest.size());
  const std::string any_rest = repeat("[0-9]", rest, rest);
  if (low_rest == std::string(low_rest.size(), '0') && high_rest == std::string(high_rest.size(), '9')) {
    return "[" + low.substr(0, 1) + "-" + high.substr(0, 1) + "] " + any_rest;
  }
  std::vector<std::string> parts;
  parts.push_back(literal(low.substr(0, 1)) + " (" + same_length_range(low_rest, std::string(low_rest.size(), '9')) + ")");
  if (high[0] - low[0] > 1) {
    parts.push_back("[" + std::string(1, char(low[0] + 1)) + "-" + std::string(1, char(high[0] - 1)) + "] " + any_rest);
  }
  parts.push_back(literal(high.substr(0, 1)) + " (" + same_length_range(std::string(high_rest.size(), '0'), high_rest) + ")");
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : " | ") + p;
  return out;
}

// Non-negative integers from low to high, without leading zeros.
std::string natural_range(int64_t low, int64_t high) {
  std::string out;
  int64_t length_start = 1;  // the smallest number with this many digits (0 for one digit)
  for (int digits = 1; digits <= kIntegerDigits; ++digits) {
    const int64_t first = digits == 1 ? 0 : length_start;
    const int64_t last = length_start * 10 - 1;
    length_start *= 10;
    const int64_t from = std::max(low, first), to = std::min(high, last);
    if (from > to) continue;
    out += (out.empty() ? "(" : " | (") + same_length_range(std::to_string(from), std::to_string(to)) + ")";
  }
  return out;
}

class Compiler {
 public:
  std::string text() const {
    std::string out;
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
  }

  void add(const std::string& name, const std::string& body) { rules_.emplace_back(name, body); }

  // A rule for the schema (found at `where` in document `root`), named from `hint`.
  std::string compile(const json& root, const json& schema, const std::string& where, const std::string& hint) {
    root_ = &root;
    return value(schema, where, hint, 0);
  }

  std::string primitive(const std::string& name) {
    if (defined_.insert(name).second) {
      if (name == "ws") {
        add(name, "\" \"?");
      } else if (name == "char") {
        add(name, "[^\"\\\\\\x00-\\x1F\\x7F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})");
      } else if (name == "string") {
        add(name, "\"\\\"\" " + primitive("char") + "* \"\\\"\"");
      } else if (name == "integer") {
        add(name, "\"-\"? (\"0\" | [1-9] " + repeat("[0-9]", 0, kIntegerDigits - 1) + ")");
      } else if (name == "number") {
        add(name, primitive("integer") + " (\".\" " + repeat("[0-9]", 1, kFractionDigits) + ")? ([eE] [-+]? " +
                      repeat("[0-9]", 1, kExponentDigits) + ")?");
      } else if (name == "boolean") {
        add(name, "\"true\" | \"false\"");
      } else if (name == "null") {
        add(name, "\"null\"");
      } else if (name == "value") {
        add(name, "object | array | string | number | boolean | null");
        for (const char* p : {"object", "array", "string", "number", "boolean", "null"}) primitive(p);
      } else if (name == "object") {
        const std::string member = primitive("string") + " " + primitive("ws") + " \":\" ws value ws";
        add(name, "\"{\" ws (" + member + " (\",\" ws " + member + ")*)? \"}\"");
        primitive("value");
      } else if (name == "array") {
        add(name, "\"[\" " + primitive("ws") + " (value ws (\",\" ws value ws)*)? \"]\"");
        primitive("value");
      }
    }
    return name;
  }

 private:
  [[noreturn]] static void fail(const std::string& where, const std::string& what) {
    throw SchemaError("schema" + (where.empty() ? std::string() : " at " + where) + ": " + what);
  }

  std::string new_name(const std::string& hint) {
    std::string base;
    for (char c : hint) base += (std::isalnum(static_cast<unsigned char>(c)) != 0) ? c : '-';
    if (base.empty() || base.size() > 40) base = "schema";
    std::string name = base;
    for (int i = 1; !defined_.insert(name).second; ++i) name = base + "-" + std::to_string(i);
    return name;
  }

  std::string rule(const std::string& hint, const std::string& body) {
    const std::string name = new_name(hint);
    add(name, body);
    return name;
  }

  static int bound(const json& schema, const char* key, const std::string& where) {
    const json& v = schema[key];
    if (!v.is_number_integer() && !(v.is_number_float() && std::floor(v.get<double>()) == v.get<double>())) {
      fail(where + "/" + key, "must be a non-negative integer");
    }
    const double d = v.get<double>();
    if (d < 0) fail(where + "/" + key, "must be a non-negative integer");
    if (d > kMaxRepeat) fail(where + "/" + key, "above " + std::to_string(kMaxRepeat) + " is not supported");
    return static_cast<int>(d);
  }

  std::string value(const json& schema, const std::string& where, const std::string& hint, int depth) {
    if (depth > kMaxDepth) fail(where, "nested too deeply");
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) fail(where, "the schema false accepts nothing");
      return primitive("value");
    }
    if (!schema.is_object()) fail(where, "a schema must be an object or a boolean");
    std::vector<std::string> unsupported;
    for (const auto& [key, v] : schema.items()) {
      if (supported_keywords().count(key) == 0 && annotation_keywords().count(key) == 0) unsupported.push_back(key);
    }
    if (!unsupported.empty()) {
      std::string names;
      for (const std::string& k : unsupported) names += (names.empty() ? "" : ", ") + k;
      fail(where, "unsupported keyword" + std::string(unsupported.size() > 1 ? "s: " : ": ") + names);
    }
    const auto others = [&](const char* except, const char* allowed = "") {
      for (const auto& [key, v] : schema.items()) {
        if (key != except && key != allowed && supported_keywords().count(key) != 0) {
          fail(where, std::string(except) + " together with " + key + " is not supported");
        }
      }
    };
    if (schema.contains("$ref")) {
      others("$ref");
      return reference(schema["$ref"], where, depth);
    }
    for (const char* combiner : {"anyOf", "oneOf"}) {
      if (!schema.contains(combiner)) continue;
      others(combiner);
      const json& options = schema[combiner];
      if (!options.is_array() || options.empty()) fail(where + "/" + combiner, "must be a non-empty array");
      std::string body;
      for (size_t i = 0; i < options.size(); ++i) {
        body += (i == 0 ? "" : " | ") + value(options[i], where + "/" + combiner + "/" + std::to_string(i), hint, depth + 1);
      }
      return rule(hint, body);
    }
    if (schema.contains("const") || schema.contains("enum")) {
      std::vector<json> values;
      const char* keyword = schema.contains("const") ? "const" : "enum";
      others(keyword, "type");
      if (schema.contains("const")) {
        values.push_back(schema["const"]);
      } else {
        if (!schema["enum"].is_array() || schema["enum"].empty()) fail(where + "/enum", "must be a non-empty array");
        values = schema["enum"].get<std::vector<json>>();
      }
      const std::vector<std::string> types = schema.contains("type") ? types_of(schema, where) : std::vector<std::string>{};
      std::string body;
      for (const json& v : values) {
        if (!types.empty() && std::none_of(types.begin(), types.end(), [&](const std::string& t) { return has_type(v, t); })) {
          fail(where + "/" + keyword, "the value " + dump(v, where) + " does not have the schema's type");
        }
        body += (body.empty() ? "" : " | ") + literal(dump(v, where));
      }
      return rule(hint, body);
    }
    return typed(schema, where, hint, depth);
  }

  static bool has_type(const json& v, const std::string& type) {
    if (type == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    if (type == "number") return v.is_number();
    if (type == "string") return v.is_string();
    if (type == "boolean") return v.is_boolean();
    if (type == "null") return v.is_null();
    if (type == "object") return v.is_object();
    return v.is_array();
  }

  static std::string dump(const json& v, const std::string& where) {
    try {
      return v.dump();
    } catch (const json::exception&) {
      fail(where, "a value is not valid UTF-8");
    }
  }

  std::string reference(const json& ref, const std::string& where, int depth) {
    if (!ref.is_string()) fail(where + "/$ref", "must be a string");
    const std::string target = ref.get<std::string>();
    if (target.empty() || target[0] != '#') fail(where + "/$ref", "only references within the schema (#/...) are supported");
    const auto [it, added] = references_.emplace(target, "");
    if (!added) return it->second;
    const json* resolved = nullptr;
    try {
      resolved = &root_->at(json::json_pointer(target.substr(1)));
    } catch (const json::exception&) {
      fail(where + "/$ref", "'" + target + "' does not resolve");
    }
    const std::string tail = target.substr(target.find_last_of('/') + 1);
    const std::string name = new_name("ref-" + tail);
    it->second = name;
    // The rule is named before its body is compiled, so that the body may refer to it.
    const size_t slot = rules_.size();
    add(name, "");
    rules_[slot].second = value(*resolved, target.substr(1), name + "-body", depth + 1);
    return name;
  }

  std::vector<std::string> types_of(const json& schema, const std::string& where) {
    static const std::vector<std::string> all = {"object", "array", "string", "number", "integer", "boolean", "null"};
    std::vector<std::string> types;
    if (schema.contains("type")) {
      const json& t = schema["type"];
      const std::vector<json> listed = t.is_array() ? t.get<std::vector<json>>() : std::vector<json>{t};
      if (listed.empty()) fail(where + "/type", "must not be an empty array");
      for (const json& one : listed) {
        if (!one.is_string() || std::find(all.begin(), all.end(), one.get<std::string>()) == all.end()) {
          fail(where + "/type", "must be one of object, array, string, number, integer, boolean, null (or an array of them)");
        }
        types.push_back(one.get<std::string>());
      }
      // integer is a part of number.
      if (std::find(types.begin(), types.end(), "number") != types.end()) std::erase(types, std::string("integer"));
      return types;
    }
    // Without a type, the keywords tell which kind is meant.
    for (const char* key : {"properties", "required", "additionalProperties"}) {
      if (schema.contains(key)) return {"object"};
    }
    for (const char* key : {"items", "minItems", "maxItems"}) {
      if (schema.contains(key)) return {"array"};
    }
    for (const char* key : {"minLength", "maxLength"}) {
      if (schema.contains(key)) return {"string"};
    }
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (schema.contains(key)) return {"number"};
    }
    return {};
  }

  std::string typed(const json& schema, const std::string& where, const std::string& hint, int depth) {
    const std::vector<std::string> types = types_of(schema, where);
    if (types.empty()) return primitive("value");
    std::string body;
    for (const std::string& type : types) {
      std::string one;
      if (type == "object") {
        one = object(schema, where, hint, depth);
      } else if (type == "array") {
        one = array(schema, where, hint, depth);
      } else if (type == "string") {
        one = string(schema, where);
      } else if (type == "integer") {
        one = integer(schema, where);
      } else if (type == "number") {
        for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
          if (schema.contains(key)) fail(where + "/" + key, "is supported for integers only");
        }
        one = primitive("number");
      } else {
        one = primitive(type);
      }
      body += (body.empty() ? "" : " | ") + one;
    }
    return rule(hint, body);
  }

  std::string string(const json& schema, const std::string& where) {
    const int min = schema.contains("minLength") ? bound(schema, "minLength", where) : 0;
    std::optional<int> max;
    if (schema.contains("maxLength")) max = bound(schema, "maxLength", where);
    if (max && *max < min) fail(where, "maxLength is below minLength");
    if (min == 0 && !max) return primitive("string");
    return "\"\\\"\" " + repeat(primitive("char"), min, max) + " \"\\\"\"";
  }

  static std::optional<double> number_at(const json& schema, const char* key, const std::string& where) {
    if (!schema.contains(key)) return std::nullopt;
    const json& v = schema[key];
    if (!v.is_number()) fail(where + "/" + key, "must be a number");
    return v.get<double>();
  }

  std::string integer(const json& schema, const std::string& where) {
    double low = -static_cast<double>(kLargestInteger), high = static_cast<double>(kLargestInteger);
    if (auto v = number_at(schema, "minimum", where)) low = std::max(low, std::ceil(*v));
    if (auto v = number_at(schema, "exclusiveMinimum", where)) low = std::max(low, std::floor(*v) + 1);
    if (auto v = number_at(schema, "maximum", where)) high = std::min(high, std::floor(*v));
    if (auto v = number_at(schema, "exclusiveMaximum", where)) high = std::min(high, std::ceil(*v) - 1);
    if (low > high) fail(where, "no integer lies within its minimum and maximum (of at most 16 digits)");
    if (low == -static_cast<double>(kLargestInteger) && high == static_cast<double>(kLargestInteger)) {
      return primitive("integer");
    }
    const auto lo = static_cast<int64_t>(low), hi = static_cast<int64_t>(high);
    std::string body;
    if (lo < 0) body = "\"-\" (" + natural_range(std::max<int64_t>(1, hi < 0 ? -hi : 1), -lo) + ")";
    if (hi >= 0) body += (body.empty() ? "(" : " | (") + natural_range(std::max<int64_t>(0, lo), hi) + ")";
    return "(" + body + ")";
  }

  std::string array(const json& schema, const std::string& where, const std::string& hint, int depth) {
    const std::string item =
        schema.contains("items") ? value(schema["items"], where + "/items", hint + "-item", depth + 1) : primitive("value");
    const int min = schema.contains("minItems") ? bound(schema, "minItems", where) : 0;
    std::optional<int> max;
    if (schema.contains("maxItems")) max = bound(schema, "maxItems", where);
    if (max && *max < min) fail(where, "maxItems is below minItems");
    const std::string ws = primitive("ws");
    if (max && *max == 0) return "\"[\" " + ws + " \"]\"";
    const std::string more = "(\",\" " + ws + " " + item + " " + ws + ")";
    const std::string items = item + " " + ws + " " + repeat(more, std::max(0, min - 1), max ? std::optional<int>(*max - 1) : std::nullopt);
    return "\"[\" " + ws + " " + (min == 0 ? "(" + items + ")?" : items) + " \"]\"";
  }

  std::string object(const json& schema, const std::string& where, const std::string& hint, int depth) {
    const std::string ws = primitive("ws");
    std::vector<std::string> names;
    std::vector<const json*> schemas;
    if (schema.contains("properties")) {
      const json& props = schema["properties"];
      if (!props.is_object()) fail(where + "/properties", "must be an object");
      for (const auto& [name, sub] : props.items()) {
        names.push_back(name);
        schemas.push_back(&sub);
      }
    }
    std::set<std::string> required;
    if (schema.contains("required")) {
      const json& req = schema["required"];
      if (!req.is_array()) fail(where + "/required", "must be an array of strings");
      for (const json& name : req) {
        if (!name.is_string()) fail(where + "/required", "must be an array of strings");
        required.insert(name.get<std::string>());
      }
    }
    const json* additional = schema.contains("additionalProperties") ? &schema["additionalProperties"] : nullptr;
    if (additional && !additional->is_boolean() && !additional->is_object()) {
      fail(where + "/additionalProperties", "must be a schema");
    }
    const bool closed = additional && additional->is_boolean() && !additional->get<bool>();
    static const json any = true;
    for (const std::string& name : required) {  // required but not described: any value
      if (std::find(names.begin(), names.end(), name) == names.end()) {
        if (closed) fail(where + "/required", "'" + name + "' is required but additionalProperties is false");
        names.push_back(name);
        schemas.push_back(&any);
      }
    }
    if (names.empty()) {
      if (closed) return "\"{\" " + ws + " \"}\"";
      const std::string member_value =
          additional ? value(*additional, where + "/additionalProperties", hint + "-additional", depth + 1) : primitive("value");
      const std::string member = primitive("string") + " " + ws + " \":\" " + ws + " " + member_value + " " + ws;
      return "\"{\" " + ws + " (" + member + " (\",\" " + ws + " " + member + ")*)? \"}\"";
    }
    // Properties in the schema's order, the optional ones perhaps left out: first_i is the rest
    // when nothing is written yet and the first is property i or later; rest_i the rest after
    // something was written.
    const size_t n = names.size();
    std::vector<std::string> members(n);
    for (size_t i = 0; i < n; ++i) {
      std::string key;
      try {
        key = json(names[i]).dump();
      } catch (const json::exception&) {
        fail(where + "/properties", "a property name is not valid UTF-8");
      }
      members[i] = literal(key) + " " + ws + " \":\" " + ws + " " +
                   value(*schemas[i], where + "/properties/" + names[i], hint + "-" + names[i], depth + 1) + " " + ws;
    }
    const std::string base = new_name(hint + "-props");
    std::vector<std::string> first(n + 1), rest(n + 1);
    for (size_t i = n + 1; i-- > 0;) {
      first[i] = base + "-first-" + std::to_string(i);
      rest[i] = base + "-rest-" + std::to_string(i);
      defined_.insert(first[i]);
      defined_.insert(rest[i]);
      if (i == n) {
        add(first[i], "\"\"");
        add(rest[i], "\"\"");
        continue;
      }
      const bool optional = required.count(names[i]) == 0;
      add(first[i], members[i] + " " + rest[i + 1] + (optional ? " | " + first[i + 1] : ""));
      add(rest[i], "\",\" " + ws + " " + members[i] + " " + rest[i + 1] + (optional ? " | " + rest[i + 1] : ""));
    }
    return "\"{\" " + ws + " " + first[0] + " \"}\"";
  }

  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> defined_{"root"};
  std::map<std::string, std::string> references_;
  const json* root_ = nullptr;
};

// The compiled text, checked by parsing it, which also refuses schemas that recur without
// consuming anything ({"$ref": "#"}).
std::string checked(const std::string& text) {
  try {
    parse_gbnf(text);
  } catch (const GrammarError& e) {
    throw SchemaError(std::string("schema: cannot be generated: ") + e.what());
  }
  return text;
}

}  // namespace

std::string json_schema_grammar(const json& schema) {
  Compiler compiler;
  const std::string top = compiler.compile(schema, schema, "", "root-value");
  compiler.add("root", top);
  return checked(compiler.text());
}

std::string json_object_grammar() {
  Compiler compiler;
  compiler.add("root", compiler.primitive("object"));
  return checked(compiler.text());
}

std::string wrapped_json_grammar(const std::vector<WrappedSchema>& alternatives) {
  if (alternatives.empty()) throw SchemaError("schema: no alternatives to choose from");
  Compiler compiler;
  std::string body;
  for (size_t i = 0; i < alternatives.size(); ++i) {
    const WrappedSchema& a = alternatives[i];
    const std::string top = compiler.compile(a.schema, a.schema, "", "alternative-" + std::to_string(i));
    body += (i == 0 ? "" : " | ") + literal(a.prefix) + " " + top + " " + literal(a.suffix);
  }
  compiler.add("root", body);
  return checked(compiler.text());
}

}  // namespace strata::constrain
