#include "template/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace strata::jinja {

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return real(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array items;
      for (const auto& item : j) items.push_back(from_json(item));
      return array(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object entries;
      for (const auto& [key, item] : j.items()) entries.emplace_back(string(key), from_json(item));
      return object(std::move(entries));
    }
    default:
      throw TemplateError("unsupported JSON value in the context");
  }
}

const Value* Value::find(std::string_view key) const {
  for (const auto& [k, v] : *object_)
    if (k.is_string() && k.as_string() == key) return &v;
  return nullptr;
}

const Value* Value::find(const Value& key) const {
  for (const auto& [k, v] : *object_)
    if (equal(k, key)) return &v;
  return nullptr;
}

void Value::set(Value key, Value v) const {
  if (key.kind() == Kind::Array || key.kind() == Kind::Object || key.kind() == Kind::Namespace)
    throw TemplateError("unhashable type: '" + key.type_name() + "'");
  for (auto& [k, old] : *object_)
    if (equal(k, key)) {
      old = std::move(v);
      return;
    }
  object_->emplace_back(std::move(key), std::move(v));
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
    case Kind::Int:
      return int_ != 0;
    case Kind::Float:
      return float_ != 0;
    case Kind::String:
      return !str_.empty();
    case Kind::Array:
      return sequence_ == Sequence::Generator || !array_->empty();
    case Kind::Object:
      return !object_->empty();
    case Kind::Namespace:
    case Kind::Function:
      return true;
  }
  return false;
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // The shortest digits that read back as d, placed as Python's repr places them.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, end);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  int exponent = std::stoi(sci.substr(e + 1));
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exponent) + 1) + "." +
            digits.substr(static_cast<size_t>(exponent) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp;
  }
  return negative ? "-" + out : out;
}

namespace {

bool py_isprintable(char32_t c) {
  if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) return false;
  if ((c >= 0x200b && c <= 0x200f) || (c >= 0x2028 && c <= 0x202e) || c == 0xfeff) return false;
  return true;
}

std::string py_string_repr(const std::string& s) {
  char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : utf8_decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!py_isprintable(c)) {
      char buf[16];
      if (c < 0x100)
        std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      else
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += utf8_encode(std::u32string_view(&c, 1));
    }
  }
  return out + quote;
}

std::string dict_repr(const Object& entries) {
  std::string out = "{";
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i) out += ", ";
    out += entries[i].first.repr() + ": " + entries[i].second.repr();
  }
  return out + "}";
}

}  // namespace

std::string Value::str() const {
  switch (kind_) {
    case Kind::Undefined:
      return "";
    case Kind::String:
      return str_;
    default:
      return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "None";
    case Kind::Bool:
      return int_ ? "True" : "False";
    case Kind::Int:
      return std::to_string(int_);
    case Kind::Float:
      return py_float_repr(float_);
    case Kind::String:
      return py_string_repr(str_);
    case Kind::Array: {
      if (sequence_ == Sequence::Generator)
        throw TemplateError("unsupported: printing a generator (jinja2 prints its address)");
      bool tuple = sequence_ == Sequence::Tuple;
      std::string out = tuple ? "(" : "[";
      for (size_t i = 0; i < array_->size(); ++i) {
        if (i) out += ", ";
        out += (*array_)[i].repr();
      }
      if (tuple && array_->size() == 1) out += ",";
      return out + (tuple ? ")" : "]");
    }
    case Kind::Object:
      return dict_repr(*object_);
    case Kind::Namespace:
      return "<Namespace " + dict_repr(*object_) + ">";
    case Kind::Function:
      return "<function " + str_ + ">";
  }
  return "";
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::Array:
      return sequence_ == Sequence::Tuple       ? "tuple"
             : sequence_ == Sequence::Generator ? "generator"
                                                : "list";
    case Kind::Object:
      return "dict";
    case Kind::Namespace:
      return "Namespace";
    case Kind::Function:
      return "function";
  }
  return "";
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind() || a.is_generator() || b.is_generator()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return true;
    case Value::Kind::String:
      return a.as_string() == b.as_string();
    case Value::Kind::Array:
      if (a.sequence() != b.sequence()) return false;
      return std::equal(a.items().begin(), a.items().end(), b.items().begin(), b.items().end(),
                        equal);
    case Value::Kind::Object: {
      if (a.entries().size() != b.entries().size()) return false;
      for (const auto& [key, v] : a.entries()) {
        const Value* other = b.find(key);
        if (!other || !equal(v, *other)) return false;
      }
      return true;
    }
    default:
      return &a.entries() == &b.entries();
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return a.as_int() < b.as_int();
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_array() && b.is_array())
    return std::lexicographical_compare(a.items().begin(), a.items().end(), b.items().begin(),
                                        b.items().end(), less);
  throw TemplateError("'<' not supported between instances of '" + a.type_name() + "' and '" +
                      b.type_name() + "'");
}

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : utf8_decode(s)) {
    char buf[16];
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c > 0x7e)) {
          if (c >= 0x10000) {
            char32_t v = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x",
                          static_cast<unsigned>(0xd800 + (v >> 10)),
                          static_cast<unsigned>(0xdc00 + (v & 0x3ff)));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          }
          out += buf;
        } else {
          out += utf8_encode(std::u32string_view(&c, 1));
        }
    }
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, const JsonFormat& f, int depth) {
  auto newline = [&](int level) {
    if (f.indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(f.indent * level), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::None:
      out += "null";
      return;
    case Value::Kind::Bool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::Float: {
      double d = v.as_double();
      out += std::isnan(d)   ? "NaN"
             : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                             : py_float_repr(d);
      return;
    }
    case Value::Kind::String:
      json_string(out, v.as_string(), f.ensure_ascii);
      return;
    case Value::Kind::Array: {
      if (v.is_generator())
        throw TemplateError("Object of type generator is not JSON serializable");
      if (v.items().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i) out += f.item_separator;
        newline(depth + 1);
        json_value(out, v.items()[i], f, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::Object: {
      if (v.entries().empty()) {
        out += "{}";
        return;
      }
      // json.dumps writes the keys Python allows as strings.
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [key, item] : v.entries()) {
        std::string k;
        switch (key.kind()) {
          case Value::Kind::String:
            k = key.as_string();
            break;
          case Value::Kind::Int:
            k = std::to_string(key.as_int());
            break;
          case Value::Kind::Bool:
            k = key.as_bool() ? "true" : "false";
            break;
          case Value::Kind::None:
            k = "null";
            break;
          case Value::Kind::Float:
            k = py_float_repr(key.as_double());
            break;
          default:
            throw TemplateError("keys must be str, int, float, bool or None");
        }
        entries.emplace_back(std::move(k), &item);
      }
      if (f.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += f.item_separator;
        newline(depth + 1);
        json_string(out, entries[i].first, f.ensure_ascii);
        out += f.key_separator;
        json_value(out, *entries[i].second, f, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    default:
      throw TemplateError("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonFormat& format) {
  std::string out;
  json_value(out, v, format, 0);
  return out;
}

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) {
      // Invalid UTF-8 cannot come from JSON; keep the byte rather than lose it.
      out += c;
      ++i;
      continue;
    }
    char32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out += cp;
    i += n;
  }
  return out;
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xc0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xe0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (c & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (c & 0x3f));
    }
  }
  return out;
}

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

namespace {

// The lowercase partner of an uppercase letter, or 0.
char32_t lower_of(char32_t c) {
  if ((c >= 'A' && c <= 'Z') || (c >= 0xc0 && c <= 0xde && c != 0xd7) ||
      (c >= 0x391 && c <= 0x3ab && c != 0x3a2) || (c >= 0x410 && c <= 0x42f))
    return c + 0x20;
  if (c >= 0x400 && c <= 0x40f) return c + 0x50;
  if (c == 0x178) return 0xff;
  if (c == 0x130) return 0;  // İ lowers to two code points; left as it is
  // Latin Extended-A pairs an uppercase letter with the next code point, evenly or oddly aligned.
  bool even_pairs = (c >= 0x100 && c <= 0x137) || (c >= 0x14a && c <= 0x177);
  bool odd_pairs = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
  if ((even_pairs && c % 2 == 0) || (odd_pairs && c % 2 == 1)) return c + 1;
  return 0;
}

char32_t upper_of(char32_t c) {
  if (c == 0xff) return 0x178;
  if (c == 0xb5) return 0x39c;
  if (c == 0x3c2) return 0x3a3;
  if (c == 0x131) return 'I';
  if (c == 0x17f) return 'S';
  char32_t candidates[] = {c - 0x20, c - 0x50, c - 1};
  for (char32_t u : candidates)
    if (u < c && lower_of(u) == c) return u;
  return 0;
}

}  // namespace

std::string py_change_case(std::string_view s, bool upper) {
  std::u32string out;
  for (char32_t c : utf8_decode(s)) {
    if (upper && c == 0xdf) {
      out += U"SS";
      continue;
    }
    char32_t m = upper ? upper_of(c) : lower_of(c);
    out += m ? m : c;
  }
  return utf8_encode(out);
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace strata::jinja
