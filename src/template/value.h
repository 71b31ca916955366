// The values a template computes with, behaving as the Python objects jinja2 gives templates:
// lists and dicts are shared by reference (a template appends to a list it reached through a
// namespace), dicts keep insertion order, and str() and repr() print as Python prints.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "template/jinja.h"

namespace strata::jinja {

class Value;
using Array = std::vector<Value>;
// Keys are strings but for dicts a template writes ({0: 'a'}); Python's dicts keep their order.
using Object = std::vector<std::pair<Value, Value>>;

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
};
using Function = std::function<Value(CallArgs&)>;

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, Array, Object, Namespace, Function };

  Value() = default;  // Undefined
  static Value undefined(std::string hint) {
    Value v;
    v.str_ = std::move(hint);
    return v;
  }
  static Value none() { return Value(Kind::None); }
  static Value boolean(bool b) {
    Value v(Kind::Bool);
    v.int_ = b;
    return v;
  }
  static Value integer(int64_t i) {
    Value v(Kind::Int);
    v.int_ = i;
    return v;
  }
  static Value real(double d) {
    Value v(Kind::Float);
    v.float_ = d;
    return v;
  }
  // safe: a markupsafe.Markup, which escapes the plain strings added to it.
  static Value string(std::string s, bool safe = false) {
    Value v(Kind::String);
    v.str_ = std::move(s);
    v.safe_ = safe;
    return v;
  }
  // A tuple prints as one; a generator (what jinja2's select, map and unique return) is only
  // iterated: it has no length, cannot be serialized, and is true however empty.
  enum class Sequence { List, Tuple, Generator };
  static Value array(Array items = {}, Sequence sequence = Sequence::List) {
    Value v(Kind::Array);
    v.array_ = std::make_shared<Array>(std::move(items));
    v.sequence_ = sequence;
    return v;
  }
  static Value object(Object items = {}, Kind kind = Kind::Object) {
    Value v(kind);
    v.object_ = std::make_shared<Object>(std::move(items));
    return v;
  }
  static Value function(std::string name, Function f) {
    Value v(Kind::Function);
    v.str_ = std::move(name);
    v.function_ = std::make_shared<Function>(std::move(f));
    return v;
  }
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_object() const { return kind_ == Kind::Object; }
  // Python's bool is an int.
  bool is_int() const { return kind_ == Kind::Int || kind_ == Kind::Bool; }
  bool is_number() const { return is_int() || kind_ == Kind::Float; }
  bool is_safe() const { return kind_ == Kind::String && safe_; }
  Sequence sequence() const { return sequence_; }
  bool is_generator() const { return kind_ == Kind::Array && sequence_ == Sequence::Generator; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }
  double as_double() const { return kind_ == Kind::Float ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const { return str_; }
  // For Undefined: what was looked up, for the error that using it raises.
  const std::string& undefined_hint() const { return str_; }
  Array& items() const { return *array_; }
  Object& entries() const { return *object_; }
  const Function& callable() const { return *function_; }

  // nullptr when absent.
  const Value* find(std::string_view key) const;
  const Value* find(const Value& key) const;
  void set(Value key, Value v) const;

  bool truthy() const;
  // Python's str(): what {{ }} prints (Undefined prints nothing).
  std::string str() const;
  // Python's repr(), as str() prints the items of a list or dict.
  std::string repr() const;
  std::string type_name() const;

 private:
  explicit Value(Kind kind) : kind_(kind) {}

  Kind kind_ = Kind::Undefined;
  bool safe_ = false;
  Sequence sequence_ = Sequence::List;
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::shared_ptr<Array> array_;
  std::shared_ptr<Object> object_;
  std::shared_ptr<Function> function_;
};

// Python's ==.
bool equal(const Value& a, const Value& b);
// Python's <; throws TemplateError where Python raises TypeError.
bool less(const Value& a, const Value& b);

std::string py_float_repr(double d);

struct JsonFormat {
  int indent = -1;  // -1: on one line
  std::string item_separator;
  std::string key_separator = ": ";
  bool ensure_ascii = false;
  bool sort_keys = false;
};
// Python's json.dumps; throws TemplateError for what it cannot serialize.
std::string to_json(const Value& v, const JsonFormat& format);

// Strings as Python indexes them: by code point.
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
bool py_isspace(char32_t c);
// Python's str.upper() and str.lower() for Latin, Greek and Cyrillic; other scripts unchanged.
std::string py_change_case(std::string_view s, bool upper);
std::string html_escape(std::string_view s);

}  // namespace strata::jinja
