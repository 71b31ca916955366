#include <cmath>
#include <limits>
#include <sstream>

#include "gguf/gguf.h"

namespace strata::gguf {

const char* value_type_name(ValueType type) {
  switch (type) {
    case ValueType::UInt8: return "uint8";
    case ValueType::Int8: return "int8";
    case ValueType::UInt16: return "uint16";
    case ValueType::Int16: return "int16";
    case ValueType::UInt32: return "uint32";
    case ValueType::Int32: return "int32";
    case ValueType::Float32: return "float32";
    case ValueType::Bool: return "bool";
    case ValueType::String: return "string";
    case ValueType::Array: return "array";
    case ValueType::UInt64: return "uint64";
    case ValueType::Int64: return "int64";
    case ValueType::Float64: return "float64";
  }
  return "unknown";
}

std::optional<uint64_t> Value::as_uint() const {
  if (const auto* u = std::get_if<uint64_t>(&data)) return *u;
  if (const auto* i = std::get_if<int64_t>(&data); i && *i >= 0) return static_cast<uint64_t>(*i);
  return std::nullopt;
}

std::optional<int64_t> Value::as_int() const {
  if (const auto* i = std::get_if<int64_t>(&data)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&data);
      u && *u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return static_cast<int64_t>(*u);
  }
  return std::nullopt;
}

std::optional<double> Value::as_float() const {
  if (const auto* d = std::get_if<double>(&data)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&data)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&data)) return static_cast<double>(*i);
  return std::nullopt;
}

std::optional<bool> Value::as_bool() const {
  if (const auto* b = std::get_if<bool>(&data)) return *b;
  return std::nullopt;
}

const std::string* Value::as_string() const { return std::get_if<std::string>(&data); }

const Array* Value::as_array() const { return std::get_if<Array>(&data); }

std::string Value::to_display(size_t max_items) const {
  std::ostringstream out;
  if (const auto* s = as_string()) {
    constexpr size_t kMaxChars = 80;
    out << '"' << (s->size() > kMaxChars ? s->substr(0, kMaxChars) + "..." : *s) << '"';
  } else if (const auto* a = as_array()) {
    out << '[';
    for (size_t i = 0; i < a->items.size() && i < max_items; ++i) {
      out << (i ? ", " : "") << a->items[i].to_display(max_items);
    }
    if (a->items.size() > max_items) out << ", ... (" << a->items.size() << " items)";
    out << ']';
  } else if (const auto* b = std::get_if<bool>(&data)) {
    out << (*b ? "true" : "false");
  } else if (const auto* d = std::get_if<double>(&data)) {
    out << *d;
  } else if (const auto* u = std::get_if<uint64_t>(&data)) {
    out << *u;
  } else if (const auto* i = std::get_if<int64_t>(&data)) {
    out << *i;
  }
  return out.str();
}

uint64_t TensorInfo::elements() const {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  return n;
}

}  // namespace strata::gguf
