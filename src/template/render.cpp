// Evaluation with Python's semantics as jinja2 gives them to templates: Undefined is empty and
// falsy until something is looked up on it, subscripts and attributes fall back to each other,
// and the immutable sandbox refuses the methods that modify a list or dict.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>
#include <set>
#include <unordered_map>

#include "template/ast.h"

namespace strata::jinja {
namespace {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;

  const Value* lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { Normal, Break, Continue };

[[noreturn]] void undefined_error(const Value& v) {
  throw TemplateError(v.undefined_hint().empty() ? "undefined value" : v.undefined_hint());
}

// An argument by position or name, as Python binds them.
const Value* arg(const CallArgs& args, size_t index, std::string_view name) {
  for (const auto& [k, v] : args.named)
    if (k == name) return &v;
  return index < args.positional.size() ? &args.positional[index] : nullptr;
}
Value arg_or(const CallArgs& args, size_t index, std::string_view name, Value fallback) {
  const Value* v = arg(args, index, name);
  return v ? *v : fallback;
}

int64_t to_index(const Value& v, const std::string& what) {
  if (!v.is_int()) throw TemplateError(what + " must be an integer, not " + v.type_name());
  return v.as_int();
}

// ---- strings ----

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  std::u32string u = utf8_decode(s);
  std::u32string set = chars.is_string() ? utf8_decode(chars.as_string()) : std::u32string();
  bool whitespace = chars.is_none() || chars.is_undefined();
  auto strip_this = [&](char32_t c) {
    return whitespace ? py_isspace(c) : set.find(c) != std::u32string::npos;
  };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_this(u[b])) ++b;
  if (right)
    while (e > b && strip_this(u[e - 1])) --e;
  return utf8_encode(std::u32string_view(u).substr(b, e - b));
}

Value py_split(const std::string& s, const Value& sep, int64_t maxsplit) {
  Array out;
  if (sep.is_none() || sep.is_undefined()) {
    std::u32string u = utf8_decode(s);
    size_t i = 0;
    while (true) {
      while (i < u.size() && py_isspace(u[i])) ++i;
      if (i >= u.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        size_t e = u.size();
        while (e > i && py_isspace(u[e - 1])) --e;
        out.push_back(Value::string(utf8_encode(std::u32string_view(u).substr(i, e - i))));
        break;
      }
      size_t j = i;
      while (j < u.size() && !py_isspace(u[j])) ++j;
      out.push_back(Value::string(utf8_encode(std::u32string_view(u).substr(i, j - i))));
      i = j;
    }
    return Value::array(std::move(out));
  }
  if (!sep.is_string()) throw TemplateError("must be str or None, not " + sep.type_name());
  const std::string& d = sep.as_string();
  if (d.empty()) throw TemplateError("empty separator");
  size_t start = 0;
  while (true) {
    size_t p = s.find(d, start);
    if (p == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit)) {
      out.push_back(Value::string(s.substr(start)));
      break;
    }
    out.push_back(Value::string(s.substr(start, p - start)));
    start = p + d.size();
  }
  return Value::array(std::move(out));
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python puts the replacement between every character and at both ends.
    std::u32string u = utf8_decode(s);
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || static_cast<int64_t>(i) < count) out += to;
      if (i < u.size()) out += utf8_encode(std::u32string_view(u).substr(i, 1));
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t p = s.find(from, start);
    if (p == std::string::npos) break;
    out += s.substr(start, p - start) + to;
    start = p + from.size();
    ++done;
  }
  return out + s.substr(start);
}

std::string py_title(const std::string& s) {
  std::string out = s;
  bool previous_cased = false;
  for (char& c : out) {
    auto u = static_cast<unsigned char>(c);
    bool cased = std::isalpha(u);
    c = static_cast<char>(cased ? (previous_cased ? std::tolower(u) : std::toupper(u)) : u);
    previous_cased = cased;
  }
  return out;
}

bool prefix_match(const std::string& s, const Value& prefixes, bool start) {
  auto one = [&](const Value& p) {
    if (!p.is_string()) throw TemplateError("startswith/endswith take str or a tuple of str");
    const std::string& x = p.as_string();
    return start ? s.starts_with(x) : s.ends_with(x);
  };
  if (prefixes.is_array())
    return std::any_of(prefixes.items().begin(), prefixes.items().end(), one);
  return one(prefixes);
}

// ---- sequences ----

// What a for loop or a filter iterates: Python's iter().
Array iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return {};
    case Value::Kind::Array:
      return v.items();
    case Value::Kind::Object: {
      Array keys;
      for (const auto& [k, _] : v.entries()) keys.push_back(k);
      return keys;
    }
    case Value::Kind::String: {
      Array chars;
      for (char32_t c : utf8_decode(v.as_string()))
        chars.push_back(Value::string(utf8_encode(std::u32string_view(&c, 1))));
      return chars;
    }
    default:
      throw TemplateError("'" + v.type_name() + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return 0;
    case Value::Kind::String:
      return static_cast<int64_t>(utf8_decode(v.as_string()).size());
    case Value::Kind::Array:
      if (v.is_generator()) break;
      return static_cast<int64_t>(v.items().size());
    case Value::Kind::Object:
      return static_cast<int64_t>(v.entries().size());
    default:
      break;
  }
  throw TemplateError("object of type '" + v.type_name() + "' has no len()");
}
Value pairs(const Value& v, Value::Sequence sequence = Value::Sequence::List) {
  Array out;
  for (const auto& [k, item] : v.entries())
    out.push_back(Value::array({k, item}, Value::Sequence::Tuple));
  return Value::array(std::move(out), sequence);
}

bool contains(const Value& container, const Value& needle) {
  switch (container.kind()) {
    case Value::Kind::Undefined:
      return false;
    case Value::Kind::String:
      if (!needle.is_string())
        throw TemplateError("'in <string>' requires string as left operand, not " +
                            needle.type_name());
      return container.as_string().find(needle.as_string()) != std::string::npos;
    case Value::Kind::Array:
      return std::any_of(container.items().begin(), container.items().end(),
                         [&](const Value& item) { return equal(item, needle); });
    case Value::Kind::Object:
    case Value::Kind::Namespace:
      return container.find(needle) != nullptr;
    default:
      throw TemplateError("argument of type '" + container.type_name() + "' is not iterable");
  }
}

// Python's slice of a list or string.
template <class Seq>
Seq slice(const Seq& seq, const Value& start, const Value& stop, const Value& step_v) {
  auto n = static_cast<int64_t>(seq.size());
  int64_t step = step_v.is_none() || step_v.is_undefined() ? 1 : to_index(step_v, "slice step");
  if (step == 0) throw TemplateError("slice step cannot be zero");
  auto bound = [&](const Value& v, int64_t fallback) {
    if (v.is_none() || v.is_undefined()) return fallback;
    int64_t i = to_index(v, "slice index");
    if (i < 0) i += n;
    return step > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  int64_t b = bound(start, step > 0 ? 0 : n - 1);
  int64_t e = bound(stop, step > 0 ? n : -1);
  Seq out;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step)
    out.push_back(seq[static_cast<size_t>(i)]);
  return out;
}

// ---- arithmetic ----

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      // markupsafe: adding a plain string to a Markup escapes the plain one.
      if (a.is_safe() || b.is_safe()) {
        std::string left = a.is_safe() ? a.as_string() : html_escape(a.as_string());
        std::string right = b.is_safe() ? b.as_string() : html_escape(b.as_string());
        return Value::string(left + right, true);
      }
      return Value::string(a.as_string() + b.as_string());
    }
    if (a.is_array() && b.is_array()) {
      Array out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return Value::array(std::move(out));
    }
  }
  if (op == "*" && ((a.is_array() && b.is_int()) || (a.is_int() && b.is_array()))) {
    const Value& list = a.is_array() ? a : b;
    int64_t times = a.is_array() ? b.as_int() : a.as_int();
    Array out;
    for (int64_t i = 0; i < times; ++i)
      out.insert(out.end(), list.items().begin(), list.items().end());
    return Value::array(std::move(out));
  }
  if (op == "*" && ((a.is_string() && b.is_int()) || (a.is_int() && b.is_string()))) {
    const Value& s = a.is_string() ? a : b;
    int64_t times = a.is_string() ? b.as_int() : a.as_int();
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += s.as_string();
    return Value::string(out);
  }
  if (a.is_number() && b.is_number()) {
    bool ints = a.is_int() && b.is_int();
    if (op == "/") {
      if (b.as_double() == 0) throw TemplateError("division by zero");
      return Value::real(a.as_double() / b.as_double());
    }
    if (op == "//" || op == "%") {
      if (b.as_double() == 0) throw TemplateError("integer division or modulo by zero");
      if (ints) {
        int64_t q = a.as_int() / b.as_int(), r = a.as_int() % b.as_int();
        if (r != 0 && ((r < 0) != (b.as_int() < 0))) {
          --q;
          r += b.as_int();
        }
        return Value::integer(op == "//" ? q : r);
      }
      double q = std::floor(a.as_double() / b.as_double());
      return Value::real(op == "//" ? q : a.as_double() - q * b.as_double());
    }
    if (op == "**") {
      if (ints && b.as_int() >= 0) {
        int64_t r = 1;
        for (int64_t i = 0; i < b.as_int(); ++i) r *= a.as_int();
        return Value::integer(r);
      }
      return Value::real(std::pow(a.as_double(), b.as_double()));
    }
    if (ints) {
      if (op == "+") return Value::integer(a.as_int() + b.as_int());
      if (op == "-") return Value::integer(a.as_int() - b.as_int());
      if (op == "*") return Value::integer(a.as_int() * b.as_int());
    } else {
      if (op == "+") return Value::real(a.as_double() + b.as_double());
      if (op == "-") return Value::real(a.as_double() - b.as_double());
      if (op == "*") return Value::real(a.as_double() * b.as_double());
    }
  }
  throw TemplateError("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" +
                      b.type_name() + "'");
}

// ---- tests ----

using TestFn = bool (*)(const Value&, const CallArgs&);

const std::map<std::string, TestFn, std::less<>>& tests() {
  static const std::map<std::string, TestFn, std::less<>> table = [] {
    std::map<std::string, TestFn, std::less<>> t;
    t["defined"] = [](const Value& v, const CallArgs&) { return !v.is_undefined(); };
    t["undefined"] = [](const Value& v, const CallArgs&) { return v.is_undefined(); };
    t["none"] = [](const Value& v, const CallArgs&) { return v.is_none(); };
    t["string"] = [](const Value& v, const CallArgs&) { return v.is_string(); };
    t["mapping"] = [](const Value& v, const CallArgs&) { return v.is_object(); };
    // Undefined has a length and items, so jinja2 counts it a sequence and iterable.
    t["sequence"] = [](const Value& v, const CallArgs&) {
      return v.is_string() || (v.is_array() && !v.is_generator()) || v.is_object() ||
             v.is_undefined();
    };
    t["iterable"] = [](const Value& v, const CallArgs&) {
      return v.is_string() || v.is_array() || v.is_object() || v.is_undefined();
    };
    t["number"] = [](const Value& v, const CallArgs&) { return v.is_number(); };
    t["integer"] = [](const Value& v, const CallArgs&) { return v.kind() == Value::Kind::Int; };
    t["float"] = [](const Value& v, const CallArgs&) { return v.kind() == Value::Kind::Float; };
    t["boolean"] = [](const Value& v, const CallArgs&) { return v.kind() == Value::Kind::Bool; };
    t["true"] = [](const Value& v, const CallArgs&) {
      return v.kind() == Value::Kind::Bool && v.as_bool();
    };
    t["false"] = [](const Value& v, const CallArgs&) {
      return v.kind() == Value::Kind::Bool && !v.as_bool();
    };
    t["callable"] = [](const Value& v, const CallArgs&) {
      return v.kind() == Value::Kind::Function;
    };
    t["odd"] = [](const Value& v, const CallArgs&) { return to_index(v, "odd") % 2 != 0; };
    t["even"] = [](const Value& v, const CallArgs&) { return to_index(v, "even") % 2 == 0; };
    t["lower"] = [](const Value& v, const CallArgs&) {
      return v.str() == py_change_case(v.str(), false);
    };
    t["upper"] = [](const Value& v, const CallArgs&) {
      return v.str() == py_change_case(v.str(), true);
    };
    t["eq"] = [](const Value& v, const CallArgs& a) {
      return equal(v, arg_or(a, 0, "b", Value()));
    };
    t["equalto"] = t["=="] = t["eq"];
    t["ne"] = t["!="] = [](const Value& v, const CallArgs& a) {
      return !equal(v, arg_or(a, 0, "b", Value()));
    };
    t["lt"] = t["<"] = [](const Value& v, const CallArgs& a) {
      return less(v, arg_or(a, 0, "b", Value()));
    };
    t["gt"] = t[">"] = [](const Value& v, const CallArgs& a) {
      return less(arg_or(a, 0, "b", Value()), v);
    };
    t["le"] = t["<="] = [](const Value& v, const CallArgs& a) {
      return !less(arg_or(a, 0, "b", Value()), v);
    };
    t["ge"] = t[">="] = [](const Value& v, const CallArgs& a) {
      return !less(v, arg_or(a, 0, "b", Value()));
    };
    t["in"] = [](const Value& v, const CallArgs& a) {
      return contains(arg_or(a, 0, "seq", Value()), v);
    };
    t["divisibleby"] = [](const Value& v, const CallArgs& a) {
      int64_t d = to_index(arg_or(a, 0, "num", Value()), "divisibleby");
      if (d == 0) throw TemplateError("integer division or modulo by zero");
      return to_index(v, "divisibleby") % d == 0;
    };
    t["sameas"] = [](const Value& v, const CallArgs& a) {
      Value o = arg_or(a, 0, "other", Value());
      if (v.kind() != o.kind()) return false;
      switch (v.kind()) {
        case Value::Kind::Undefined:
        case Value::Kind::None:
          return true;
        case Value::Kind::Bool:
          return v.as_bool() == o.as_bool();
        case Value::Kind::Array:
          return &v.items() == &o.items();
        case Value::Kind::Object:
        case Value::Kind::Namespace:
          return &v.entries() == &o.entries();
        default:
          return equal(v, o);
      }
    };
    return t;
  }();
  return table;
}

bool run_test(const std::string& name, const Value& v, const CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) throw TemplateError("No test named '" + name + "' found.");
  return it->second(v, args);
}

}  // namespace

bool has_test(std::string_view name) { return tests().count(name) > 0; }

namespace {

// ---- attributes, items and methods ----

Value unsafe(const std::string& method, const Value& on) {
  return Value::undefined("access to attribute '" + method + "' of '" + on.type_name() +
                          "' object is unsafe.");
}

Value string_method(const Value& self, const std::string& name) {
  std::string s = self.as_string();
  bool safe = self.is_safe();
  auto method = [&](Function f) { return Value::function(name, std::move(f)); };
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return method([s, safe, name](CallArgs& a) {
      return Value::string(
          py_strip(s, arg_or(a, 0, "chars", Value::none()), name != "rstrip", name != "lstrip"),
          safe);
    });
  if (name == "split")
    return method([s](CallArgs& a) {
      return py_split(s, arg_or(a, 0, "sep", Value::none()),
                      to_index(arg_or(a, 1, "maxsplit", Value::integer(-1)), "maxsplit"));
    });
  if (name == "startswith" || name == "endswith")
    return method([s, name](CallArgs& a) {
      return Value::boolean(prefix_match(s, arg_or(a, 0, "prefix", Value()), name == "startswith"));
    });
  if (name == "replace")
    return method([s, safe](CallArgs& a) {
      Value from = arg_or(a, 0, "old", Value()), to = arg_or(a, 1, "new", Value());
      if (!from.is_string() || !to.is_string())
        throw TemplateError("replace() takes str arguments");
      return Value::string(py_replace(s, from.as_string(), to.as_string(),
                                      to_index(arg_or(a, 2, "count", Value::integer(-1)), "count")),
                           safe);
    });
  if (name == "upper" || name == "lower")
    return method(
        [s, name](CallArgs&) { return Value::string(py_change_case(s, name == "upper")); });
  if (name == "title") return method([s](CallArgs&) { return Value::string(py_title(s)); });
  if (name == "capitalize")
    return method([s](CallArgs&) {
      return Value::string(s.empty() ? s
                                     : py_change_case(s.substr(0, 1), true) +
                                           py_change_case(s.substr(1), false));
    });
  if (name == "find" || name == "count")
    return method([s, name](CallArgs& a) {
      Value sub = arg_or(a, 0, "sub", Value());
      if (!sub.is_string()) throw TemplateError(name + "() takes a str");
      if (name == "find") {
        size_t p = s.find(sub.as_string());
        return Value::integer(
            p == std::string::npos ? -1 : static_cast<int64_t>(utf8_decode(s.substr(0, p)).size()));
      }
      int64_t n = 0;
      for (size_t p = s.find(sub.as_string()); p != std::string::npos;
           p = s.find(sub.as_string(), p + std::max<size_t>(1, sub.as_string().size())))
        ++n;
      return Value::integer(n);
    });
  if (name == "join")
    return method([s](CallArgs& a) {
      std::string out;
      Array items = iterate(arg_or(a, 0, "iterable", Value()));
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].is_string())
          throw TemplateError("sequence item " + std::to_string(i) + ": expected str instance");
        out += (i ? s : "") + items[i].as_string();
      }
      return Value::string(out);
    });
  return Value::undefined("'str object' has no attribute '" + name + "'");
}

Value dict_method(const Value& self, const std::string& name) {
  if (name == "items") return Value::function(name, [self](CallArgs&) { return pairs(self); });
  if (name == "keys")
    return Value::function(name, [self](CallArgs&) { return Value::array(iterate(self)); });
  if (name == "values")
    return Value::function(name, [self](CallArgs&) {
      Array out;
      for (const auto& [_, v] : self.entries()) out.push_back(v);
      return Value::array(std::move(out));
    });
  if (name == "get")
    return Value::function(name, [self](CallArgs& a) {
      Value key = arg_or(a, 0, "key", Value());
      const Value* v = self.find(key);
      return v ? *v : arg_or(a, 1, "default", Value::none());
    });
  static const std::set<std::string> mutating = {"pop", "popitem", "setdefault", "update", "clear"};
  if (mutating.count(name)) return unsafe(name, self);
  const Value* v = self.find(name);
  return v ? *v : Value::undefined("'dict object' has no attribute '" + name + "'");
}

Value list_method(const Value& self, const std::string& name) {
  if (name == "index" || name == "count")
    return Value::function(name, [self, name](CallArgs& a) {
      Value x = arg_or(a, 0, "value", Value());
      int64_t n = 0;
      for (size_t i = 0; i < self.items().size(); ++i) {
        if (!equal(self.items()[i], x)) continue;
        if (name == "index") return Value::integer(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") throw TemplateError(x.repr() + " is not in list");
      return Value::integer(n);
    });
  static const std::set<std::string> mutating = {"append", "pop",     "insert", "extend",
                                                 "remove", "reverse", "sort",   "clear"};
  if (mutating.count(name)) return unsafe(name, self);
  return Value::undefined("'list object' has no attribute '" + name + "'");
}

Value get_attr(const Value& base, const std::string& name) {
  switch (base.kind()) {
    case Value::Kind::Undefined:
      undefined_error(base);
    case Value::Kind::Object:
      return dict_method(base, name);
    case Value::Kind::Namespace: {
      const Value* v = base.find(name);
      return v ? *v : Value::undefined("'Namespace' object has no attribute '" + name + "'");
    }
    case Value::Kind::String:
      return string_method(base, name);
    case Value::Kind::Array:
      return list_method(base, name);
    default:
      return Value::undefined("'" + base.type_name() + " object' has no attribute '" + name + "'");
  }
}

Value get_item(const Value& base, const Value& key) {
  switch (base.kind()) {
    case Value::Kind::Undefined:
      undefined_error(base);
    case Value::Kind::Object:
    case Value::Kind::Namespace: {
      const Value* v = base.find(key);
      if (v) return *v;
      if (!key.is_string()) break;
      return base.is_object() ? get_attr(base, key.as_string())
                              : Value::undefined("no item '" + key.as_string() + "'");
    }
    case Value::Kind::Array:
    case Value::Kind::String: {
      if (key.is_string() && base.is_array()) return list_method(base, key.as_string());
      if (key.is_string()) return string_method(base, key.as_string());
      if (!key.is_int()) break;
      bool is_str = base.is_string();
      std::u32string u = is_str ? utf8_decode(base.as_string()) : std::u32string();
      int64_t n =
          is_str ? static_cast<int64_t>(u.size()) : static_cast<int64_t>(base.items().size());
      int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
      if (i < 0 || i >= n)
        return Value::undefined(std::string(is_str ? "string" : "list") + " index out of range");
      return is_str ? Value::string(
                          utf8_encode(std::u32string_view(u).substr(static_cast<size_t>(i), 1)))
                    : base.items()[static_cast<size_t>(i)];
    }
    default:
      break;
  }
  return Value::undefined("'" + base.type_name() + " object' has no attribute " + key.repr());
}

// An item's attribute as filters reach it ("a.b" goes two levels down; digits index a list).
Value attribute_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c));
    });
    v = v.is_undefined()
            ? v
            : get_item(v, digits ? Value::integer(std::stoll(part)) : Value::string(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// ---- filters ----

class Renderer;
using FilterFn = Value (*)(Renderer&, const Value&, CallArgs&);

std::string json_dumps(const Value& v, const CallArgs& a) {
  // Hugging Face's tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
  // sort_keys=False), in that order.
  JsonFormat f;
  f.ensure_ascii = arg_or(a, 0, "ensure_ascii", Value::boolean(false)).truthy();
  Value indent = arg_or(a, 1, "indent", Value::none());
  if (indent.is_int())
    f.indent = static_cast<int>(indent.as_int());
  else if (!indent.is_none())
    throw TemplateError("tojson: indent must be an integer");
  f.item_separator = f.indent < 0 ? ", " : ",";
  Value separators = arg_or(a, 2, "separators", Value::none());
  if (separators.is_array() && separators.items().size() == 2) {
    f.item_separator = separators.items()[0].str();
    f.key_separator = separators.items()[1].str();
  } else if (!separators.is_none()) {
    throw TemplateError("tojson: separators must be a pair of strings");
  }
  f.sort_keys = arg_or(a, 3, "sort_keys", Value::boolean(false)).truthy();
  return to_json(v, f);
}

std::string indent_text(const std::string& s, const Value& width, bool first, bool blank) {
  std::string indention =
      width.is_string() ? width.as_string()
                        : std::string(static_cast<size_t>(to_index(width, "indent width")), ' ');
  // jinja2 appends a newline before splitting, so a trailing newline keeps its (empty) line.
  std::string text = s + "\n";
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n' || text[i] == '\r') {
      lines.push_back(text.substr(start, i - start));
      if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  if (start < text.size()) lines.push_back(text.substr(start));
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += "\n";
    bool indent_line = i > 0 && (blank || !lines[i].empty());
    out += (indent_line ? indention : "") + lines[i];
  }
  return first ? indention + out : out;
}

Value sorted(Array items, bool reverse, bool case_sensitive, const Value& attribute) {
  auto key = [&](const Value& v) {
    Value k = attribute.is_string() ? attribute_path(v, attribute.as_string()) : v;
    return (!case_sensitive && k.is_string()) ? Value::string(py_change_case(k.as_string(), false))
                                              : k;
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    return reverse ? less(key(b), key(a)) : less(key(a), key(b));
  });
  return Value::array(std::move(items));
}

const std::map<std::string, FilterFn, std::less<>>& filters();

class Renderer {
 public:
  Renderer(const std::tm& now) : now_(now) {}

  void render(const Body& body, const ScopePtr& scope, std::string& out) {
    if (exec(body, scope, out) != Flow::Normal)
      throw TemplateError("break or continue outside a loop");
  }

  Value call_filter(const std::string& name, const Value& input, CallArgs& args) {
    auto it = filters().find(name);
    if (it == filters().end()) throw TemplateError("No filter named '" + name + "' found.");
    return it->second(*this, input, args);
  }

  Value call(const Value& callee, CallArgs& args) {
    if (callee.is_undefined()) undefined_error(callee);
    if (callee.kind() != Value::Kind::Function)
      throw TemplateError("'" + callee.type_name() + "' object is not callable");
    return callee.callable()(args);
  }

  Value globals_function(const std::string& name) {
    if (name == "raise_exception")
      return Value::function(name, [](CallArgs& a) -> Value {
        throw RaisedError(arg_or(a, 0, "message", Value()).str());
      });
    if (name == "strftime_now")
      return Value::function(name, [this](CallArgs& a) {
        std::string format = arg_or(a, 0, "format", Value()).str();
        char buf[256];
        size_t n = std::strftime(buf, sizeof buf, format.c_str(), &now_);
        return Value::string(std::string(buf, n));
      });
    if (name == "range")
      return Value::function(name, [](CallArgs& a) {
        std::vector<int64_t> p;
        for (const Value& v : a.positional) p.push_back(to_index(v, "range()"));
        if (p.empty() || p.size() > 3) throw TemplateError("range expected 1 to 3 arguments");
        int64_t start = p.size() > 1 ? p[0] : 0, stop = p.size() > 1 ? p[1] : p[0],
                step = p.size() > 2 ? p[2] : 1;
        if (step == 0) throw TemplateError("range() arg 3 must not be zero");
        Array out;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
          // The sandbox's limit on ranges.
          if (out.size() >= 100000)
            throw TemplateError(
                "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
          out.push_back(Value::integer(i));
        }
        return Value::array(std::move(out));
      });
    if (name == "namespace" || name == "dict")
      return Value::function(name, [name](CallArgs& a) {
        Object entries;
        for (const Value& p : a.positional) {
          if (!p.is_object()) throw TemplateError(name + "() takes a mapping");
          for (const auto& e : p.entries()) entries.push_back(e);
        }
        Value v = Value::object(std::move(entries),
                                name == "namespace" ? Value::Kind::Namespace : Value::Kind::Object);
        for (auto& [k, item] : a.named) v.set(Value::string(k), item);
        return v;
      });
    return Value::undefined("'" + name + "' is undefined");
  }

 private:
  Flow exec(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const auto& s : body) {
      Flow f = exec(*s, scope, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec(const Stmt& s, const ScopePtr& scope, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::Text:
        out += s.text;
        return Flow::Normal;
      case Stmt::Kind::Output:
        out += eval(*s.expr, scope).str();
        return Flow::Normal;
      case Stmt::Kind::If:
        for (const auto& [condition, body] : s.branches)
          if (!condition || eval(*condition, scope).truthy()) return exec(body, scope, out);
        return Flow::Normal;
      case Stmt::Kind::For:
        return exec_for(s, scope, out);
      case Stmt::Kind::Set:
        assign(*s.target, eval(*s.expr, scope), scope);
        return Flow::Normal;
      case Stmt::Kind::SetBlock: {
        std::string text;
        render(s.body, scope, text);
        assign(*s.target, Value::string(text), scope);
        return Flow::Normal;
      }
      case Stmt::Kind::Macro:
        scope->vars[s.text] = macro(s, scope);
        return Flow::Normal;
      case Stmt::Kind::FilterBlock: {
        std::string text;
        render(s.body, scope, text);
        out += apply_filters(*s.expr, Value::string(text), scope).str();
        return Flow::Normal;
      }
      case Stmt::Kind::Break:
        return Flow::Break;
      case Stmt::Kind::Continue:
        return Flow::Continue;
    }
    return Flow::Normal;
  }

  void bind(const std::vector<std::string>& names, const Value& item, Scope& scope) {
    if (names.size() == 1) {
      scope.vars[names[0]] = item;
      return;
    }
    Array parts = iterate(item);
    if (parts.size() != names.size())
      throw TemplateError("cannot unpack " + std::to_string(parts.size()) + " values into " +
                          std::to_string(names.size()));
    for (size_t i = 0; i < names.size(); ++i) scope.vars[names[i]] = parts[i];
  }

  Flow exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
    Value iterable = eval(*s.expr, scope);
    if (iterable.is_none()) throw TemplateError("'NoneType' object is not iterable");
    Array items = iterate(iterable);
    if (s.condition) {
      Array kept;
      for (const Value& item : items) {
        auto probe = std::make_shared<Scope>();
        probe->parent = scope;
        bind(s.names, item, *probe);
        if (eval(*s.condition, probe).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty())
      return exec(s.else_body, scope, out) == Flow::Break ? Flow::Break : Flow::Normal;
    auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      auto iteration = std::make_shared<Scope>();
      iteration->parent = scope;
      bind(s.names, items[static_cast<size_t>(i)], *iteration);
      Value loop = Value::object({}, Value::Kind::Namespace);
      auto field = [&](const char* name, Value v) { loop.set(Value::string(name), std::move(v)); };
      field("index", Value::integer(i + 1));
      field("index0", Value::integer(i));
      field("revindex", Value::integer(n - i));
      field("revindex0", Value::integer(n - i - 1));
      field("first", Value::boolean(i == 0));
      field("last", Value::boolean(i == n - 1));
      field("length", Value::integer(n));
      field("depth", Value::integer(1));
      field("depth0", Value::integer(0));
      if (i > 0) field("previtem", items[static_cast<size_t>(i - 1)]);
      if (i + 1 < n) field("nextitem", items[static_cast<size_t>(i + 1)]);
      iteration->vars["loop"] = loop;
      if (exec(s.body, iteration, out) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  void assign(const Expr& target, const Value& value, const ScopePtr& scope) {
    switch (target.kind) {
      case Expr::Kind::Name:
        scope->vars[target.name] = value;
        return;
      case Expr::Kind::Attr: {
        Value ns = eval(*target.args[0], scope);
        if (ns.kind() != Value::Kind::Namespace)
          throw TemplateError("template line " + std::to_string(target.line) +
                              ": cannot assign attribute on non-namespace object");
        ns.set(Value::string(target.name), value);
        return;
      }
      default: {
        Array parts = iterate(value);
        if (parts.size() != target.args.size())
          throw TemplateError("cannot unpack " + std::to_string(parts.size()) + " values");
        for (size_t i = 0; i < parts.size(); ++i) assign(*target.args[i], parts[i], scope);
      }
    }
  }

  Value macro(const Stmt& s, const ScopePtr& scope) {
    std::weak_ptr<Scope> defined_in = scope;
    return Value::function(s.text, [this, &s, defined_in](CallArgs& a) {
      // Where Python would stop a macro that calls itself without end (RecursionError).
      if (macro_depth_ >= 200)
        throw TemplateError("macro '" + s.text + "': maximum recursion depth exceeded");
      ++macro_depth_;
      struct Leave {
        int& depth;
        ~Leave() { --depth; }
      } leave{macro_depth_};
      auto frame = std::make_shared<Scope>();
      frame->parent = defined_in.lock();
      if (a.positional.size() > s.names.size())
        throw TemplateError("macro '" + s.text + "' takes not more than " +
                            std::to_string(s.names.size()) + " argument(s)");
      for (const auto& [k, _] : a.named)
        if (std::find(s.names.begin(), s.names.end(), k) == s.names.end())
          throw TemplateError("macro '" + s.text + "' takes no keyword argument '" + k + "'");
      for (size_t i = 0; i < s.names.size(); ++i) {
        const Value* given = arg(a, i, s.names[i]);
        frame->vars[s.names[i]] =
            given           ? *given
            : s.defaults[i] ? eval(*s.defaults[i], frame)
                            : Value::undefined("parameter '" + s.names[i] + "' was not provided");
      }
      std::string text;
      render(s.body, frame, text);
      return Value::string(text);
    });
  }

  CallArgs eval_args(const Expr& e, size_t first, const ScopePtr& scope) {
    CallArgs a;
    for (size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i], scope));
    for (const auto& [k, v] : e.kwargs) a.named.emplace_back(k, eval(*v, scope));
    return a;
  }

  // A filter chain whose innermost input is null (a filter block) applied to input.
  Value apply_filters(const Expr& e, const Value& input, const ScopePtr& scope) {
    Value inner = e.args[0] ? apply_filters(*e.args[0], input, scope) : input;
    CallArgs a = eval_args(e, 1, scope);
    return call_filter(e.name, inner, a);
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case Expr::Kind::Literal:
        return e.literal;
      case Expr::Kind::Name: {
        const Value* v = scope->lookup(e.name);
        return v ? *v : globals_function(e.name);
      }
      case Expr::Kind::List: {
        Array items;
        for (const auto& item : e.args) items.push_back(eval(*item, scope));
        return Value::array(std::move(items),
                            e.name == "tuple" ? Value::Sequence::Tuple : Value::Sequence::List);
      }
      case Expr::Kind::Dict: {
        Value d = Value::object();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i], scope);
          d.set(std::move(k), eval(*e.args[i + 1], scope));
        }
        return d;
      }
      case Expr::Kind::Attr:
        return get_attr(eval(*e.args[0], scope), e.name);
      case Expr::Kind::Item:
        return get_item(eval(*e.args[0], scope), eval(*e.args[1], scope));
      case Expr::Kind::Slice: {
        Value base = eval(*e.args[0], scope);
        auto part = [&](size_t i) { return e.args[i] ? eval(*e.args[i], scope) : Value::none(); };
        Value b = part(1), s = part(2), step = part(3);
        if (base.is_undefined()) undefined_error(base);
        if (base.is_array()) return Value::array(slice(base.items(), b, s, step));
        if (base.is_string())
          return Value::string(utf8_encode(slice(utf8_decode(base.as_string()), b, s, step)));
        return Value::undefined("'" + base.type_name() + "' object is not subscriptable");
      }
      case Expr::Kind::Call: {
        Value callee = eval(*e.args[0], scope);
        CallArgs a = eval_args(e, 1, scope);
        return call(callee, a);
      }
      case Expr::Kind::Filter: {
        Value input = eval(*e.args[0], scope);
        CallArgs a = eval_args(e, 1, scope);
        return call_filter(e.name, input, a);
      }
      case Expr::Kind::Test: {
        Value input = eval(*e.args[0], scope);
        CallArgs a = eval_args(e, 1, scope);
        return Value::boolean(run_test(e.name, input, a) != e.negated);
      }
      case Expr::Kind::Unary: {
        Value v = eval(*e.args[0], scope);
        if (e.name == "not") return Value::boolean(!v.truthy());
        if (v.is_undefined()) undefined_error(v);
        if (!v.is_number())
          throw TemplateError("bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
        if (e.name == "+") return v;
        return v.kind() == Value::Kind::Float ? Value::real(-v.as_double())
                                              : Value::integer(-v.as_int());
      }
      case Expr::Kind::And: {
        Value a = eval(*e.args[0], scope);
        return a.truthy() ? eval(*e.args[1], scope) : a;
      }
      case Expr::Kind::Or: {
        Value a = eval(*e.args[0], scope);
        return a.truthy() ? a : eval(*e.args[1], scope);
      }
      case Expr::Kind::Cond:
        if (eval(*e.args[1], scope).truthy()) return eval(*e.args[0], scope);
        return e.args[2] ? eval(*e.args[2], scope)
                         : Value::undefined("the conditional expression's else");
      case Expr::Kind::Binary: {
        Value a = eval(*e.args[0], scope);
        Value b = eval(*e.args[1], scope);
        const std::string& op = e.name;
        if (op == "~") return Value::string(a.str() + b.str());
        if (op == "==") return Value::boolean(equal(a, b));
        if (op == "!=") return Value::boolean(!equal(a, b));
        if (op == "<") return Value::boolean(less(a, b));
        if (op == ">") return Value::boolean(less(b, a));
        if (op == "<=") return Value::boolean(!less(b, a));
        if (op == ">=") return Value::boolean(!less(a, b));
        if (op == "in") return Value::boolean(contains(b, a));
        if (op == "not in") return Value::boolean(!contains(b, a));
        return arithmetic(op, a, b);
      }
    }
    return Value();
  }

  std::tm now_;
  int macro_depth_ = 0;
};

Value select(const Value& input, CallArgs& a, bool by_attribute, bool keep) {
  Array out;
  size_t first_test_arg = by_attribute ? 1 : 0;
  Value attribute = by_attribute ? arg_or(a, 0, "attribute", Value()) : Value();
  Value test = first_test_arg < a.positional.size() ? a.positional[first_test_arg] : Value();
  CallArgs test_args;
  for (size_t i = first_test_arg + 1; i < a.positional.size(); ++i)
    test_args.positional.push_back(a.positional[i]);
  if (test.is_string() && !has_test(test.as_string()))
    throw TemplateError("No test named '" + test.as_string() + "'");
  for (const Value& item : input.truthy() ? iterate(input) : Array()) {
    Value subject = by_attribute ? attribute_path(item, attribute.str()) : item;
    bool pass =
        test.is_string() ? run_test(test.as_string(), subject, test_args) : subject.truthy();
    if (pass == keep) out.push_back(item);
  }
  return Value::array(std::move(out), Value::Sequence::Generator);
}

const std::map<std::string, FilterFn, std::less<>>& filters() {
  static const std::map<std::string, FilterFn, std::less<>> table = [] {
    std::map<std::string, FilterFn, std::less<>> f;
    f["tojson"] = [](Renderer&, const Value& v, CallArgs& a) {
      return Value::string(json_dumps(v, a));
    };
    f["length"] =
        f["count"] = [](Renderer&, const Value& v, CallArgs&) { return Value::integer(length(v)); };
    f["trim"] = [](Renderer&, const Value& v, CallArgs& a) {
      return Value::string(py_strip(v.str(), arg_or(a, 0, "chars", Value::none()), true, true),
                           v.is_safe());
    };
    f["string"] = [](Renderer&, const Value& v, CallArgs&) {
      return v.is_string() ? v : Value::string(v.str());
    };
    f["default"] = f["d"] = [](Renderer&, const Value& v, CallArgs& a) {
      bool boolean = arg_or(a, 1, "boolean", Value::boolean(false)).truthy();
      if (v.is_undefined() || (boolean && !v.truthy()))
        return arg_or(a, 0, "default_value", Value::string(""));
      return v;
    };
    f["items"] = [](Renderer&, const Value& v, CallArgs&) {
      if (v.is_undefined()) return Value::array();
      if (!v.is_object()) throw TemplateError("Can only get item pairs from a mapping.");
      return pairs(v, Value::Sequence::Generator);
    };
    f["join"] = [](Renderer&, const Value& v, CallArgs& a) {
      std::string sep = arg_or(a, 0, "d", Value::string("")).str();
      Value attribute = arg_or(a, 1, "attribute", Value::none());
      std::string out;
      Array items = iterate(v);
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += sep;
        out += (attribute.is_none() ? items[i] : attribute_path(items[i], attribute.str())).str();
      }
      return Value::string(out);
    };
    f["upper"] = [](Renderer&, const Value& v, CallArgs&) {
      return Value::string(py_change_case(v.str(), true));
    };
    f["lower"] = [](Renderer&, const Value& v, CallArgs&) {
      return Value::string(py_change_case(v.str(), false));
    };
    f["title"] = [](Renderer&, const Value& v, CallArgs&) {
      return Value::string(py_title(v.str()));
    };
    f["capitalize"] = [](Renderer&, const Value& v, CallArgs&) {
      std::string s = v.str();
      return Value::string(s.empty() ? s
                                     : py_change_case(s.substr(0, 1), true) +
                                           py_change_case(s.substr(1), false));
    };
    f["safe"] = [](Renderer&, const Value& v, CallArgs&) { return Value::string(v.str(), true); };
    f["escape"] = f["e"] = [](Renderer&, const Value& v, CallArgs&) {
      return v.is_safe() ? v : Value::string(html_escape(v.str()), true);
    };
    f["dictsort"] = [](Renderer&, const Value& v, CallArgs& a) {
      if (!v.is_object()) throw TemplateError("dictsort: the value is not a mapping");
      bool case_sensitive = arg_or(a, 0, "case_sensitive", Value::boolean(false)).truthy();
      std::string by = arg_or(a, 1, "by", Value::string("key")).str();
      bool reverse = arg_or(a, 2, "reverse", Value::boolean(false)).truthy();
      return sorted(pairs(v).items(), reverse, case_sensitive,
                    Value::string(by == "value" ? "1" : "0"));
    };
    f["list"] = [](Renderer&, const Value& v, CallArgs&) { return Value::array(iterate(v)); };
    f["first"] = [](Renderer&, const Value& v, CallArgs&) {
      Array items = iterate(v);
      return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
    };
    f["last"] = [](Renderer&, const Value& v, CallArgs&) {
      Array items = iterate(v);
      return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
    };
    f["reverse"] = [](Renderer&, const Value& v, CallArgs&) {
      if (v.is_string()) {
        std::u32string u = utf8_decode(v.as_string());
        std::reverse(u.begin(), u.end());
        return Value::string(utf8_encode(u));
      }
      Array items = iterate(v);
      std::reverse(items.begin(), items.end());
      return Value::array(std::move(items), Value::Sequence::Generator);
    };
    f["selectattr"] = [](Renderer&, const Value& v, CallArgs& a) {
      return select(v, a, true, true);
    };
    f["rejectattr"] = [](Renderer&, const Value& v, CallArgs& a) {
      return select(v, a, true, false);
    };
    f["select"] = [](Renderer&, const Value& v, CallArgs& a) { return select(v, a, false, true); };
    f["reject"] = [](Renderer&, const Value& v, CallArgs& a) { return select(v, a, false, false); };
    f["map"] = [](Renderer& r, const Value& v, CallArgs& a) {
      Array out;
      const Value* attribute = arg(a, static_cast<size_t>(-1), "attribute");
      if (attribute) {
        Value fallback = arg_or(a, static_cast<size_t>(-1), "default", Value());
        for (const Value& item : v.truthy() ? iterate(v) : Array()) {
          Value x = attribute_path(item, attribute->str());
          out.push_back(x.is_undefined() && !fallback.is_undefined() ? fallback : x);
        }
        return Value::array(std::move(out), Value::Sequence::Generator);
      }
      if (a.positional.empty() || !a.positional[0].is_string())
        throw TemplateError("map: a filter name or attribute= is needed");
      std::string name = a.positional[0].as_string();
      if (!has_filter(name)) throw TemplateError("No filter named '" + name + "'");
      CallArgs rest;
      rest.positional.assign(a.positional.begin() + 1, a.positional.end());
      rest.named = a.named;
      for (const Value& item : v.truthy() ? iterate(v) : Array()) {
        CallArgs copy = rest;
        out.push_back(r.call_filter(name, item, copy));
      }
      return Value::array(std::move(out), Value::Sequence::Generator);
    };
    f["indent"] = [](Renderer&, const Value& v, CallArgs& a) {
      return Value::string(indent_text(v.str(), arg_or(a, 0, "width", Value::integer(4)),
                                       arg_or(a, 1, "first", Value::boolean(false)).truthy(),
                                       arg_or(a, 2, "blank", Value::boolean(false)).truthy()));
    };
    f["replace"] = [](Renderer&, const Value& v, CallArgs& a) {
      Value count = arg_or(a, 2, "count", Value::none());
      return Value::string(py_replace(v.str(), arg_or(a, 0, "old", Value()).str(),
                                      arg_or(a, 1, "new", Value()).str(),
                                      count.is_none() ? -1 : to_index(count, "count")));
    };
    f["int"] = [](Renderer&, const Value& v, CallArgs& a) {
      Value fallback = arg_or(a, 0, "default", Value::integer(0));
      if (v.is_int()) return Value::integer(v.as_int());
      if (v.kind() == Value::Kind::Float)
        return Value::integer(static_cast<int64_t>(v.as_double()));
      if (v.is_string()) {
        std::string s = py_strip(v.as_string(), Value::none(), true, true);
        try {
          size_t used = 0;
          int64_t i = std::stoll(s, &used);
          if (used == s.size()) return Value::integer(i);
          double d = std::stod(s, &used);
          if (used == s.size()) return Value::integer(static_cast<int64_t>(d));
        } catch (const std::exception&) {
        }
      }
      return fallback;
    };
    f["float"] = [](Renderer&, const Value& v, CallArgs& a) {
      if (v.is_number()) return Value::real(v.as_double());
      try {
        size_t used = 0;
        std::string s = py_strip(v.str(), Value::none(), true, true);
        double d = std::stod(s, &used);
        if (used == s.size()) return Value::real(d);
      } catch (const std::exception&) {
      }
      return arg_or(a, 0, "default", Value::real(0));
    };
    f["abs"] = [](Renderer&, const Value& v, CallArgs&) {
      if (!v.is_number())
        throw TemplateError("bad operand type for abs(): '" + v.type_name() + "'");
      return v.kind() == Value::Kind::Float ? Value::real(std::fabs(v.as_double()))
                                            : Value::integer(std::llabs(v.as_int()));
    };
    f["unique"] = [](Renderer&, const Value& v, CallArgs& a) {
      bool case_sensitive = arg_or(a, 0, "case_sensitive", Value::boolean(false)).truthy();
      Value attribute = arg_or(a, 1, "attribute", Value::none());
      Array out, seen;
      for (const Value& item : iterate(v)) {
        Value k = attribute.is_none() ? item : attribute_path(item, attribute.str());
        if (!case_sensitive && k.is_string())
          k = Value::string(py_change_case(k.as_string(), false));
        if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, k); }))
          continue;
        seen.push_back(k);
        out.push_back(item);
      }
      return Value::array(std::move(out), Value::Sequence::Generator);
    };
    f["sort"] = [](Renderer&, const Value& v, CallArgs& a) {
      return sorted(iterate(v), arg_or(a, 0, "reverse", Value::boolean(false)).truthy(),
                    arg_or(a, 1, "case_sensitive", Value::boolean(false)).truthy(),
                    arg_or(a, 2, "attribute", Value::none()));
    };
    return f;
  }();
  return table;
}

}  // namespace

bool has_filter(std::string_view name) { return filters().count(name) > 0; }

Template::Template(std::string_view source) {
  auto program = std::make_shared<Program>();
  program->body = parse(source);
  program_ = std::move(program);
}

std::string Template::render(const nlohmann::ordered_json& context, const std::tm& now) const {
  if (!context.is_object()) throw TemplateError("the context must be a JSON object");
  Renderer renderer(now);
  auto scope = std::make_shared<Scope>();
  for (const auto& [key, value] : context.items()) scope->vars[key] = Value::from_json(value);
  std::string out;
  renderer.render(program_->body, scope, out);
  return out;
}

}  // namespace strata::jinja
