#include "constrain/grammar.h"

#include <algorithm>
#include <map>
#include <optional>

#include "tokenizer/unicode.h"

namespace strata::constrain {

bool Element::matches(char32_t cp) const {
  bool inside = false;
  for (const CodepointRange& r : ranges) inside = inside || (r.first <= cp && cp <= r.last);
  return inside != negated;
}

namespace {

bool intersects(const std::vector<CodepointRange>& ranges, char32_t first, char32_t last) {
  for (const CodepointRange& r : ranges) {
    if (r.first <= last && first <= r.last) return true;
  }
  return false;
}

bool covers(const std::vector<CodepointRange>& ranges, char32_t first, char32_t last) {
  char32_t next = first;
  bool progressed = true;
  while (progressed) {
    progressed = false;
    for (const CodepointRange& r : ranges) {
      if (r.first <= next && next <= r.last) {
        if (r.last >= last) return true;
        next = r.last + 1;
        progressed = true;
      }
    }
  }
  return false;
}

}  // namespace

bool Element::matches_any(char32_t first, char32_t last) const {
  return negated ? !covers(ranges, first, last) : intersects(ranges, first, last);
}

bool Element::matches_all(char32_t first, char32_t last) const {
  return negated ? !intersects(ranges, first, last) : covers(ranges, first, last);
}

namespace {

// Bounds that keep a hostile grammar's rewriting small.
constexpr int kMaxRepetition = 1000;
constexpr int kMaxNesting = 64;
constexpr size_t kMaxElements = 1'000'000;

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : text_(text) {}

  Grammar parse() {
    skip_space(true);
    while (pos_ < text_.size()) {
      const std::string name = read_name();
      skip_space(false);
      if (text_.substr(pos_, 3) != "::=") fail("expected '::=' after the rule name '" + name + "'");
      pos_ += 3;
      const int id = rule_id(name);
      if (defined_[static_cast<size_t>(id)]) fail("the rule '" + name + "' is defined twice");
      defined_[static_cast<size_t>(id)] = true;
      grammar_.rules[static_cast<size_t>(id)].alternatives = read_alternatives(0);
      if (pos_ < text_.size() && text_[pos_] == ')') fail("')' without '('");
      skip_space(true);
    }
    for (size_t i = 0; i < grammar_.rules.size(); ++i) {
      if (!defined_[i]) throw GrammarError("grammar: the rule '" + grammar_.rules[i].name + "' is used but not defined");
    }
    const auto root = names_.find("root");
    if (root == names_.end()) throw GrammarError("grammar: there is no rule 'root'");
    grammar_.root = root->second;
    return std::move(grammar_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    size_t line = 1 + static_cast<size_t>(std::count(text_.begin(), text_.begin() + static_cast<std::ptrdiff_t>(pos_), '\n'));
    throw GrammarError("grammar: line " + std::to_string(line) + ": " + what);
  }

  static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }

  // Spaces and comments; newlines too when `newlines`, or when what follows them continues the
  // rule (its next line starts with '|' or ')' or is inside a group).
  void skip_space(bool newlines) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else {
        return;
      }
    }
  }

  // After a newline outside a group, the rule goes on unless the next line starts a rule.
  bool next_line_starts_rule() const {
    size_t p = pos_;
    while (p < text_.size() && is_name_char(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t')) ++p;
    return text_.substr(p, 3) == "::=";
  }

  // Skips space before the next item of a sequence; false when the sequence (rule) ends here.
  bool skip_to_item(int depth) {
    while (true) {
      skip_space(depth > 0);
      if (pos_ >= text_.size()) return false;
      if (text_[pos_] != '\n') return true;
      ++pos_;
      skip_space(true);
      if (pos_ >= text_.size() || next_line_starts_rule()) return false;
    }
  }

  std::string read_name() {
    const size_t start = pos_;
    while (pos_ < text_.size() && is_name_char(text_[pos_])) ++pos_;
    if (pos_ == start) fail("expected a rule name");
    return std::string(text_.substr(start, pos_ - start));
  }

  int rule_id(const std::string& name) {
    const auto [it, added] = names_.emplace(name, static_cast<int>(grammar_.rules.size()));
    if (added) {
      grammar_.rules.push_back({name, {}});
      defined_.push_back(false);
    }
    return it->second;
  }

  int new_rule(const std::string& base, std::vector<Sequence> alternatives) {
    std::string name;
    do {
      name = base + "-" + std::to_string(++generated_);
    } while (names_.count(name) != 0);
    const int id = rule_id(name);
    defined_[static_cast<size_t>(id)] = true;
    grammar_.rules[static_cast<size_t>(id)].alternatives = std::move(alternatives);
    return id;
  }

  static Element ref(int rule) {
    Element e;
    e.kind = Element::Kind::Rule;
    e.rule = rule;
    return e;
  }

  void count(size_t elements) {
    elements_ += elements;
    if (elements_ > kMaxElements) fail("the grammar is too large");
  }

  std::vector<Sequence> read_alternatives(int depth) {
    if (depth > kMaxNesting) fail("groups are nested too deeply");
    std::vector<Sequence> alternatives;
    alternatives.push_back(read_sequence(depth));
    while (pos_ < text_.size() && text_[pos_] == '|') {
      ++pos_;
      alternatives.push_back(read_sequence(depth));
    }
    return alternatives;
  }

  Sequence read_sequence(int depth) {
    Sequence seq;
    while (skip_to_item(depth)) {
      const char c = text_[pos_];
      if (c == '|' || c == ')') break;
      std::vector<Element> item;  // one element, or a literal's code points
      if (c == '"') {
        ++pos_;
        while (true) {
          if (pos_ >= text_.size()) fail("unterminated string literal");
          if (text_[pos_] == '"') break;
          const char32_t cp = read_char();
          item.push_back(Element{Element::Kind::Chars, false, {{cp, cp}}, -1});
        }
        ++pos_;
      } else if (c == '[') {
        item.push_back(read_class());
      } else if (c == '.') {
        ++pos_;
        item.push_back(Element{Element::Kind::Chars, true, {}, -1});
      } else if (c == '(') {
        ++pos_;
        std::vector<Sequence> inner = read_alternatives(depth + 1);
        if (pos_ >= text_.size() || text_[pos_] != ')') fail("expected ')'");
        ++pos_;
        item.push_back(ref(new_rule("group", std::move(inner))));
      } else if (is_name_char(c)) {
        const std::string name = read_name();
        skip_space(false);
        if (text_.substr(pos_, 3) == "::=") fail("expected a newline before the rule '" + name + "'");
        item.push_back(ref(rule_id(name)));
      } else {
        fail(std::string("unexpected character '") + c + "'");
      }
      skip_space(false);
      if (pos_ < text_.size() && (text_[pos_] == '*' || text_[pos_] == '+' || text_[pos_] == '?' || text_[pos_] == '{')) {
        if (item.empty()) fail("nothing to repeat");
        // A repeated literal repeats as a whole.
        Element repeated = item.size() == 1 ? item[0] : ref(new_rule("literal", {item}));
        item = read_repetition(repeated);
      }
      count(item.size());
      seq.insert(seq.end(), item.begin(), item.end());
    }
    return seq;
  }

  int read_number() {
    const size_t start = pos_;
    int64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      value = value * 10 + (text_[pos_] - '0');
      if (value > kMaxRepetition) fail("a repetition count is above " + std::to_string(kMaxRepetition));
      ++pos_;
    }
    if (pos_ == start) fail("expected a number");
    return static_cast<int>(value);
  }

  // x* x+ x? x{m} x{m,} x{m,n}, as m copies of x and then optional ones, nested, or a loop.
  std::vector<Element> read_repetition(const Element& x) {
    int min = 0;
    std::optional<int> max;
    const char op = text_[pos_++];
    if (op == '*') {
    } else if (op == '+') {
      min = 1;
    } else if (op == '?') {
      max = 1;
    } else {
      skip_space(false);
      min = read_number();
      skip_space(false);
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        skip_space(false);
        if (pos_ < text_.size() && text_[pos_] != '}') max = read_number();
      } else {
        max = min;
      }
      skip_space(false);
      if (pos_ >= text_.size() || text_[pos_] != '}') fail("expected '}'");
      ++pos_;
      if (max && *max < min) fail("a repetition's maximum is below its minimum");
    }
    count(static_cast<size_t>(max.value_or(min + 1)) * 2);
    std::vector<Element> out(static_cast<size_t>(min), x);
    if (!max) {
      const int loop = new_rule("repeat", {});
      grammar_.rules[static_cast<size_t>(loop)].alternatives = {{x, ref(loop)}, {}};
      out.push_back(ref(loop));
    } else if (*max > min) {
      int tail = new_rule("optional", {{x}, {}});
      for (int i = min + 1; i < *max; ++i) tail = new_rule("optional", {{x, ref(tail)}, {}});
      out.push_back(ref(tail));
    }
    return out;
  }

  uint32_t read_hex(int digits) {
    uint32_t value = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= text_.size()) fail("unterminated escape");
      const char h = text_[pos_++];
      int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) fail("expected a hex digit in an escape");
      value = value * 16 + static_cast<uint32_t>(d);
    }
    return value;
  }

  // One code point of a literal or class: an escape or a UTF-8 sequence.
  char32_t read_char() {
    if (text_[pos_] == '\\') {
      ++pos_;
      if (pos_ >= text_.size()) fail("unterminated escape");
      const char e = text_[pos_++];
      uint32_t cp = 0;
      switch (e) {
        case 'n': return '\n';
        case 't': return '\t';
        case 'r': return '\r';
        case '\\': case '"': case '[': case ']': case '-': case '^': return static_cast<char32_t>(e);
        case 'x': cp = read_hex(2); break;
        case 'u': cp = read_hex(4); break;
        case 'U': cp = read_hex(8); break;
        default: fail(std::string("unknown escape '\\") + e + "'");
      }
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail("an escape names no Unicode scalar value");
      return cp;
    }
    const tokenizer::unicode::Utf8Decoded d = tokenizer::unicode::decode_utf8_at(text_, pos_);
    if (d.status != tokenizer::unicode::Utf8Status::Valid) fail("invalid UTF-8");
    pos_ += d.length;
    return d.codepoint;
  }

  Element read_class() {
    ++pos_;  // '['
    Element e;
    if (pos_ < text_.size() && text_[pos_] == '^') {
      e.negated = true;
      ++pos_;
    }
    while (true) {
      if (pos_ >= text_.size()) fail("unterminated character class");
      if (text_[pos_] == ']') break;
      const char32_t first = read_char();
      char32_t last = first;
      if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
        ++pos_;
        last = read_char();
        if (last < first) fail("a character range ends before it starts");
      }
      e.ranges.push_back({first, last});
    }
    ++pos_;
    return e;
  }

  std::string_view text_;
  size_t pos_ = 0;
  Grammar grammar_;
  std::map<std::string, int> names_;
  std::vector<bool> defined_;
  int generated_ = 0;
  size_t elements_ = 0;
};

// The matcher expands rules until a character class is next, which never ends when a rule can
// reach itself again without reading a character.
void check_left_recursion(const Grammar& g) {
  const size_t n = g.rules.size();
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const Sequence& seq : g.rules[r].alternatives) {
        const bool empty = std::all_of(seq.begin(), seq.end(), [&](const Element& e) {
          return e.kind == Element::Kind::Rule && nullable[static_cast<size_t>(e.rule)];
        });
        if (empty) {
          nullable[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  // Rules each rule may start with.
  std::vector<std::vector<int>> starts(n);
  for (size_t r = 0; r < n; ++r) {
    for (const Sequence& seq : g.rules[r].alternatives) {
      for (const Element& e : seq) {
        if (e.kind != Element::Kind::Rule) break;
        starts[r].push_back(e.rule);
        if (!nullable[static_cast<size_t>(e.rule)]) break;
      }
    }
  }
  enum : uint8_t { Unvisited, Open, Done };
  std::vector<uint8_t> state(n, Unvisited);
  for (size_t start = 0; start < n; ++start) {
    if (state[start] != Unvisited) continue;
    std::vector<std::pair<size_t, size_t>> path{{start, 0}};  // rule, next edge
    state[start] = Open;
    while (!path.empty()) {
      auto& [rule, edge] = path.back();
      if (edge == starts[rule].size()) {
        state[rule] = Done;
        path.pop_back();
        continue;
      }
      const auto next = static_cast<size_t>(starts[rule][edge++]);
      if (state[next] == Open) {
        throw GrammarError("grammar: the rule '" + g.rules[next].name +
                           "' can reach itself without reading a character (left recursion)");
      }
      if (state[next] == Unvisited) {
        state[next] = Open;
        path.push_back({next, 0});
      }
    }
  }
}

}  // namespace

Grammar parse_gbnf(std::string_view text) {
  Grammar g = GbnfParser(text).parse();
  check_left_recursion(g);
  return g;
}

}  // namespace strata::constrain
