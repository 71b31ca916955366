// The lexer applies whitespace control as jinja2's does with trim_blocks and lstrip_blocks on;
// the parser follows jinja2's grammar and operator precedence (filters bind tighter than
// arithmetic, `not` looser than comparisons).
#include <cctype>
#include <set>
#include <stdexcept>

#include "template/ast.h"

namespace strata::jinja {
namespace {

struct Token {
  enum class Kind { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Number, Op, End };
  Kind kind;
  int line;
  std::string text;  // Text, Name, Op; String: unescaped
  Value number;
};

[[noreturn]] void fail(int line, const std::string& what) {
  throw TemplateError("template line " + std::to_string(line) + ": " + what);
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// Python's "unicode-escape" decoding, which jinja2 applies to string literals.
std::string unescape(std::string_view s, int line) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    char c = s[++i];
    auto hex = [&](size_t digits) {
      if (i + digits >= s.size()) fail(line, "truncated escape in a string");
      char32_t cp = 0;
      for (size_t k = 1; k <= digits; ++k) {
        auto d = static_cast<unsigned char>(s[i + k]);
        if (!std::isxdigit(d)) fail(line, "bad escape in a string");
        cp =
            cp * 16 + static_cast<char32_t>(std::isdigit(d) ? d - '0' : std::tolower(d) - 'a' + 10);
      }
      if (cp > 0x10ffff) fail(line, "bad escape in a string");
      i += digits;
      out += utf8_encode(std::u32string_view(&cp, 1));
    };
    switch (c) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '0':
        out += '\0';
        break;
      case '\n':
        break;
      case 'x':
        hex(2);
        break;
      case 'u':
        hex(4);
        break;
      case 'U':
        hex(8);
        break;
      default:
        out += '\\';
        out += c;
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t p = src_.find('{', pos_);
      while (p != std::string_view::npos && p + 1 < src_.size() && !is_tag_start(src_[p + 1]))
        p = src_.find('{', p + 1);
      if (p == std::string_view::npos || p + 1 >= src_.size()) {
        text(src_.substr(pos_), line_);
        pos_ = src_.size();
        break;
      }
      std::string_view data = src_.substr(pos_, p - pos_);
      char kind = src_[p + 1];
      char sign = p + 2 < src_.size() ? src_[p + 2] : 0;
      if (sign == '-') {
        while (!data.empty() && is_space(data.back())) data.remove_suffix(1);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: a block or comment tag alone on its line takes its indentation with it.
        size_t l_pos = data.rfind('\n');
        l_pos = l_pos == std::string_view::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) &&
            data.find_first_not_of(" \t", l_pos) == std::string_view::npos)
          data = data.substr(0, l_pos);
      }
      int text_line = line_;
      count_lines(pos_, p);
      text(data, text_line);
      pos_ = p + 2 + (sign == '-' || sign == '+' ? 1 : 0);
      if (kind == '#') {
        size_t end = src_.find("#}", pos_);
        if (end == std::string_view::npos) fail(line_, "unclosed comment");
        count_lines(pos_, end + 2);
        char end_sign = end > pos_ ? src_[end - 1] : 0;
        pos_ = end + 2;
        line_starting = tag_end(end_sign, true);
      } else {
        tokens_.push_back(
            {kind == '{' ? Token::Kind::VarBegin : Token::Kind::BlockBegin, line_, "", {}});
        line_starting = inside_tag(kind == '{');
      }
    }
    tokens_.push_back({Token::Kind::End, line_, "", {}});
    return std::move(tokens_);
  }

 private:
  static bool is_tag_start(char c) { return c == '{' || c == '%' || c == '#'; }

  void count_lines(size_t from, size_t to) {
    for (size_t i = from; i < to; ++i)
      if (src_[i] == '\n') ++line_;
  }

  void text(std::string_view data, int line) {
    if (!data.empty()) tokens_.push_back({Token::Kind::Text, line, std::string(data), {}});
  }

  // After a tag's end at pos_: "-" strips the whitespace that follows, trim_blocks a newline after
  // a block or comment ("+" keeps it). Returns whether the text that follows starts a line.
  bool tag_end(char sign, bool block) {
    if (sign == '-') {
      size_t start = pos_;
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      count_lines(start, pos_);
      return pos_ > start && src_[pos_ - 1] == '\n';
    }
    if (block && sign != '+' && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      ++line_;
      return true;
    }
    return false;
  }

  bool inside_tag(bool variable) {
    int depth = 0;
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) fail(line_, variable ? "unclosed '{{'" : "unclosed '{%'");
      std::string_view rest = src_.substr(pos_);
      char sign = (rest[0] == '-' || rest[0] == '+') ? rest[0] : 0;
      std::string_view after = sign ? rest.substr(1) : rest;
      std::string_view closer = variable ? "}}" : "%}";
      if (depth == 0 && after.starts_with(closer) && (sign != '+' || !variable)) {
        pos_ += closer.size() + (sign ? 1 : 0);
        tokens_.push_back({variable ? Token::Kind::VarEnd : Token::Kind::BlockEnd, line_, "", {}});
        return tag_end(sign, !variable);
      }
      char c = rest[0];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t n = 1;
        while (n < rest.size() &&
               (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_'))
          ++n;
        tokens_.push_back({Token::Kind::Name, line_, std::string(rest.substr(0, n)), {}});
        pos_ += n;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        number(rest);
      } else if (c == '\'' || c == '"') {
        string(rest);
      } else {
        static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                    "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                    "]",  "{",  "}",  ",",  ".",  ":",  "|"};
        bool found = false;
        for (const char* op : ops) {
          if (rest.starts_with(op)) {
            std::string o(op);
            if (o == "(" || o == "[" || o == "{") ++depth;
            if (o == ")" || o == "]" || o == "}") --depth;
            tokens_.push_back({Token::Kind::Op, line_, o, {}});
            pos_ += o.size();
            found = true;
            break;
          }
        }
        if (!found) fail(line_, std::string("unexpected character '") + c + "'");
      }
    }
  }

  void number(std::string_view rest) {
    size_t n = 0;
    std::string digits;
    bool is_float = false;
    auto take_digits = [&] {
      while (n < rest.size() &&
             (std::isdigit(static_cast<unsigned char>(rest[n])) || rest[n] == '_')) {
        if (rest[n] != '_') digits += rest[n];
        ++n;
      }
    };
    take_digits();
    if (n + 1 < rest.size() && rest[n] == '.' &&
        std::isdigit(static_cast<unsigned char>(rest[n + 1]))) {
      is_float = true;
      digits += rest[n++];
      take_digits();
    }
    if (n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
      size_t m = n + 1;
      if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
      if (m < rest.size() && std::isdigit(static_cast<unsigned char>(rest[m]))) {
        is_float = true;
        digits += rest.substr(n, m - n);
        n = m;
        take_digits();
      }
    }
    Value v;
    try {
      v = is_float ? Value::real(std::stod(digits)) : Value::integer(std::stoll(digits));
    } catch (const std::out_of_range&) {
      fail(line_, "number out of range: " + digits);
    }
    tokens_.push_back({Token::Kind::Number, line_, digits, v});
    pos_ += n;
  }

  void string(std::string_view rest) {
    char quote = rest[0];
    size_t n = 1;
    while (n < rest.size() && rest[n] != quote) n += rest[n] == '\\' ? 2 : 1;
    if (n >= rest.size()) fail(line_, "unterminated string");
    int line = line_;
    count_lines(pos_, pos_ + n);
    tokens_.push_back({Token::Kind::String, line, unescape(rest.substr(1, n - 1), line), {}});
    pos_ += n + 1;
  }

  std::string_view src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse_template() {
    std::string found;
    return parse_until({}, found);
  }

 private:
  const Token& cur() const { return tokens_[pos_]; }
  const Token& peek(size_t k = 1) const { return tokens_[std::min(pos_ + k, tokens_.size() - 1)]; }
  void advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool is_op(const char* op) const { return cur().kind == Token::Kind::Op && cur().text == op; }
  bool is_name(const char* name) const {
    return cur().kind == Token::Kind::Name && cur().text == name;
  }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    advance();
    return true;
  }
  std::string describe(const Token& t) const {
    switch (t.kind) {
      case Token::Kind::VarEnd:
        return "'}}'";
      case Token::Kind::BlockEnd:
        return "'%}'";
      case Token::Kind::End:
        return "the end of the template";
      case Token::Kind::String:
        return "a string";
      case Token::Kind::Number:
        return "a number";
      default:
        return "'" + t.text + "'";
    }
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    fail(cur().line, "expected " + expected + ", found " + describe(cur()));
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) unexpected(std::string("'") + op + "'");
  }
  void expect_block_end() {
    if (cur().kind != Token::Kind::BlockEnd) unexpected("'%}'");
    advance();
  }
  std::string expect_name() {
    if (cur().kind != Token::Kind::Name) unexpected("a name");
    std::string name = cur().text;
    advance();
    return name;
  }

  ExprPtr make(Expr::Kind kind, int line, std::string name = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    e->name = std::move(name);
    return e;
  }

  // Statements until a block tag whose name is one of ends, which is consumed (its name in found).
  Body parse_until(const std::set<std::string>& ends, std::string& found) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.kind == Token::Kind::End) {
        if (!ends.empty())
          fail(t.line, "unexpected end of template, expected '" + *ends.rbegin() + "'");
        return body;
      }
      if (t.kind == Token::Kind::Text) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Text;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        advance();
      } else if (t.kind == Token::Kind::VarBegin) {
        advance();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Output;
        s->line = t.line;
        s->expr = parse_tuple();
        if (cur().kind != Token::Kind::VarEnd) unexpected("'}}'");
        advance();
        body.push_back(std::move(s));
      } else if (t.kind == Token::Kind::BlockBegin) {
        advance();
        if (cur().kind == Token::Kind::Name && ends.count(cur().text)) {
          found = cur().text;
          advance();
          return body;
        }
        body.push_back(parse_statement());
      } else {
        unexpected("text or a tag");
      }
    }
  }

  StmtPtr parse_statement() {
    Nesting nesting(*this);
    auto s = std::make_unique<Stmt>();
    s->line = cur().line;
    if (cur().kind != Token::Kind::Name) unexpected("a statement");
    std::string keyword = cur().text;
    advance();
    std::string found;
    if (keyword == "if") {
      s->kind = Stmt::Kind::If;
      ExprPtr condition = parse_expression();
      expect_block_end();
      ++soft_;
      while (true) {
        Body body = parse_until({"elif", "else", "endif"}, found);
        s->branches.emplace_back(std::move(condition), std::move(body));
        if (found == "elif") {
          condition = parse_expression();
          expect_block_end();
        } else if (found == "else") {
          expect_block_end();
          s->branches.emplace_back(nullptr, parse_until({"endif"}, found));
          break;
        } else {
          break;
        }
      }
      --soft_;
      expect_block_end();
    } else if (keyword == "for") {
      s->kind = Stmt::Kind::For;
      do s->names.push_back(expect_name());
      while (skip_op(","));
      if (!skip_name("in")) unexpected("'in'");
      s->expr = parse_tuple(false);
      if (skip_name("if")) s->condition = parse_expression();
      if (is_name("recursive")) fail(cur().line, "unsupported: recursive for loops");
      expect_block_end();
      s->body = parse_until({"else", "endfor"}, found);
      if (found == "else") {
        expect_block_end();
        s->else_body = parse_until({"endfor"}, found);
      }
      expect_block_end();
    } else if (keyword == "set") {
      int line = cur().line;
      std::string name = expect_name();
      if (skip_op(".")) {
        s->target = make(Expr::Kind::Attr, line, expect_name());
        s->target->args.push_back(make(Expr::Kind::Name, line, name));
      } else if (is_op(",")) {
        s->target = make(Expr::Kind::List, line);
        s->target->args.push_back(make(Expr::Kind::Name, line, name));
        while (skip_op(",")) s->target->args.push_back(make(Expr::Kind::Name, line, expect_name()));
      } else {
        s->target = make(Expr::Kind::Name, line, name);
      }
      if (skip_op("=")) {
        s->kind = Stmt::Kind::Set;
        s->expr = parse_tuple();
        expect_block_end();
      } else {
        if (s->target->kind != Expr::Kind::Name) unexpected("'='");
        if (is_op("|")) fail(cur().line, "unsupported: filters on a block set");
        s->kind = Stmt::Kind::SetBlock;
        expect_block_end();
        s->body = parse_until({"endset"}, found);
        expect_block_end();
      }
    } else if (keyword == "macro") {
      s->kind = Stmt::Kind::Macro;
      s->text = expect_name();
      expect_op("(");
      comma_separated(")", [&] {
        s->names.push_back(expect_name());
        s->defaults.push_back(skip_op("=") ? parse_expression() : nullptr);
      });
      expect_block_end();
      s->body = parse_until({"endmacro"}, found);
      if (cur().kind == Token::Kind::Name) advance();
      expect_block_end();
    } else if (keyword == "filter") {
      s->kind = Stmt::Kind::FilterBlock;
      s->expr = parse_filters(nullptr, true);
      expect_block_end();
      s->body = parse_until({"endfilter"}, found);
      expect_block_end();
    } else if (keyword == "break" || keyword == "continue") {
      s->kind = keyword == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
      expect_block_end();
    } else {
      fail(s->line, "unsupported statement '" + keyword + "'");
    }
    return s;
  }

  // An expression, or several separated by commas (a tuple).
  ExprPtr parse_tuple(bool with_condexpr = true) {
    int line = cur().line;
    ExprPtr first = with_condexpr ? parse_expression() : parse_or();
    if (!is_op(",")) return first;
    auto list = make(Expr::Kind::List, line, "tuple");
    list->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().kind == Token::Kind::VarEnd || cur().kind == Token::Kind::BlockEnd || is_op(")"))
        break;
      list->args.push_back(with_condexpr ? parse_expression() : parse_or());
    }
    return list;
  }

  // Python's parser stops at deep nesting too; here it keeps the recursion off the stack's end.
  struct Nesting {
    Parser& p;
    explicit Nesting(Parser& parser) : p(parser) {
      if (++p.depth_ > 250) fail(p.cur().line, "nested too deeply");
    }
    ~Nesting() { --p.depth_; }
  };

  ExprPtr parse_expression() {
    Nesting nesting(*this);
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      int line = cur().line;
      advance();
      auto cond = make(Expr::Kind::Cond, line);
      cond->args.push_back(std::move(expr));
      cond->args.push_back(parse_or());
      ++soft_;
      cond->args.push_back(skip_name("else") ? parse_expression() : nullptr);
      --soft_;
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr binary(Expr::Kind kind, int line, std::string op, ExprPtr left, ExprPtr right) {
    auto e = make(kind, line, std::move(op));
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  // Items separated by commas up to `close`, a trailing comma allowed, each read by `item`.
  template <class Item>
  void comma_separated(const char* close, Item item) {
    for (bool first = true; !skip_op(close); first = false) {
      if (!first) {
        expect_op(",");
        if (skip_op(close)) return;
      }
      item();
    }
  }

  // One left-associative level: `next` operands joined by any of `ops` (words such as "or", or
  // operator tokens), each join a `kind` node of the operator's text.
  template <class Next>
  ExprPtr left_associative(Expr::Kind kind, std::initializer_list<const char*> ops, Next next) {
    ExprPtr left = (this->*next)();
    while (true) {
      const char* op = nullptr;
      for (const char* candidate : ops) {
        if (is_op(candidate) || is_name(candidate)) op = candidate;
      }
      if (op == nullptr) return left;
      const int line = cur().line;
      advance();
      left = binary(kind, line, op, std::move(left), (this->*next)());
    }
  }

  ExprPtr parse_or() { return left_associative(Expr::Kind::Or, {"or"}, &Parser::parse_and); }
  ExprPtr parse_and() { return left_associative(Expr::Kind::And, {"and"}, &Parser::parse_not); }

  ExprPtr parse_not() {
    Nesting nesting(*this);
    if (is_name("not")) {
      auto e = make(Expr::Kind::Unary, cur().line, "not");
      advance();
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr left = parse_math1();
    while (true) {
      int line = cur().line;
      std::string op;
      if (cur().kind == Token::Kind::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
           cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && peek().kind == Token::Kind::Name && peek().text == "in") {
        op = "not in";
        advance();
        advance();
      } else {
        return left;
      }
      left = binary(Expr::Kind::Binary, line, op, std::move(left), parse_math1());
    }
  }

  ExprPtr parse_math1() { return left_associative(Expr::Kind::Binary, {"+", "-"}, &Parser::parse_concat); }
  ExprPtr parse_concat() { return left_associative(Expr::Kind::Binary, {"~"}, &Parser::parse_math2); }
  ExprPtr parse_math2() {
    return left_associative(Expr::Kind::Binary, {"*", "/", "//", "%"}, &Parser::parse_pow);
  }
  ExprPtr parse_pow() { return left_associative(Expr::Kind::Binary, {"**"}, &Parser::parse_power_operand); }
  ExprPtr parse_power_operand() { return parse_unary(true); }

  ExprPtr parse_unary(bool with_filter) {
    Nesting nesting(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      node = make(Expr::Kind::Unary, cur().line, cur().text);
      advance();
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filters(std::move(node), false);
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    int line = t.line;
    if (t.kind == Token::Kind::Name) {
      std::string name = t.text;
      advance();
      if (name == "true" || name == "True") return literal(Value::boolean(true), line);
      if (name == "false" || name == "False") return literal(Value::boolean(false), line);
      if (name == "none" || name == "None") return literal(Value::none(), line);
      return make(Expr::Kind::Name, line, name);
    }
    if (t.kind == Token::Kind::String) {
      std::string s;
      while (cur().kind == Token::Kind::String) {
        s += cur().text;
        advance();
      }
      return literal(Value::string(std::move(s)), line);
    }
    if (t.kind == Token::Kind::Number) {
      Value v = t.number;
      advance();
      return literal(v, line);
    }
    if (skip_op("(")) {
      if (skip_op(")")) return make(Expr::Kind::List, line, "tuple");
      ExprPtr inner = parse_tuple();
      expect_op(")");
      return inner;
    }
    if (skip_op("[")) {
      auto list = make(Expr::Kind::List, line);
      comma_separated("]", [&] { list->args.push_back(parse_expression()); });
      return list;
    }
    if (skip_op("{")) {
      auto dict = make(Expr::Kind::Dict, line);
      comma_separated("}", [&] {
        dict->args.push_back(parse_expression());
        expect_op(":");
        dict->args.push_back(parse_expression());
      });
      return dict;
    }
    unexpected("an expression");
  }

  ExprPtr literal(Value v, int line) {
    auto e = make(Expr::Kind::Literal, line);
    e->literal = std::move(v);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      int line = cur().line;
      if (skip_op(".")) {
        if (cur().kind == Token::Kind::Number && cur().number.is_int()) {
          auto item = make(Expr::Kind::Item, line);
          item->args.push_back(std::move(node));
          item->args.push_back(literal(cur().number, line));
          advance();
          node = std::move(item);
          continue;
        }
        auto attr = make(Expr::Kind::Attr, line, expect_name());
        attr->args.push_back(std::move(node));
        node = std::move(attr);
      } else if (skip_op("[")) {
        node = parse_subscript(std::move(node), line);
      } else if (is_op("(")) {
        node = parse_call(std::move(node), line);
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr base, int line) {
    std::vector<ExprPtr> parts;
    bool slice = false;
    parts.emplace_back();
    while (!skip_op("]")) {
      if (skip_op(":")) {
        slice = true;
        parts.emplace_back();
        continue;
      }
      if (parts.back()) unexpected("']'");
      parts.back() = parse_expression();
    }
    if (!slice) {
      if (!parts[0]) unexpected("a subscript");
      auto item = make(Expr::Kind::Item, line);
      item->args.push_back(std::move(base));
      item->args.push_back(std::move(parts[0]));
      return item;
    }
    if (parts.size() > 3) fail(line, "a slice takes at most three parts");
    parts.resize(3);
    auto s = make(Expr::Kind::Slice, line);
    s->args.push_back(std::move(base));
    for (auto& p : parts) s->args.push_back(std::move(p));
    return s;
  }

  // `callee(...)`: the callee is the call's first argument, those written come after it.
  ExprPtr parse_call(ExprPtr callee, int line) {
    auto call = make(Expr::Kind::Call, line);
    call->args.push_back(std::move(callee));
    parse_call_args(*call);
    return call;
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    comma_separated(")", [&] {
      if (is_op("*") || is_op("**")) fail(cur().line, "unsupported: * and ** in calls");
      if (cur().kind == Token::Kind::Name && peek().kind == Token::Kind::Op && peek().text == "=") {
        std::string name = cur().text;
        advance();
        advance();
        call.kwargs.emplace_back(name, parse_expression());
      } else {
        if (!call.kwargs.empty())
          fail(cur().line, "a positional argument after a keyword argument");
        call.args.push_back(parse_expression());
      }
    });
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (is_op(".")) {
      advance();
      name += "." + expect_name();
    }
    return name;
  }

  // node | filter(...) | ..., node is [not] test ...; in a filter block the first filter has no
  // input (node null) and there is no leading "|".
  ExprPtr parse_filters(ExprPtr node, bool block) {
    bool first = block;
    while (true) {
      int line = cur().line;
      if (first || skip_op("|")) {
        first = false;
        std::string name = dotted_name();
        if (!has_filter(name) && !soft_) fail(line, "unsupported filter '" + name + "'");
        auto f = make(Expr::Kind::Filter, line, name);
        f->args.push_back(std::move(node));
        if (is_op("(")) parse_call_args(*f);
        node = std::move(f);
      } else if (!block && is_name("is")) {
        advance();
        bool negated = skip_name("not");
        std::string name = dotted_name();
        if (!has_test(name) && !soft_) fail(line, "unsupported test '" + name + "'");
        auto t = make(Expr::Kind::Test, line, name);
        t->negated = negated;
        t->args.push_back(std::move(node));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().kind == Token::Kind::Name || cur().kind == Token::Kind::String ||
                    cur().kind == Token::Kind::Number || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          t->args.push_back(parse_postfix(parse_primary()));
        }
        node = std::move(t);
      } else if (!block && is_op("(")) {
        node = parse_call(std::move(node), line);
      } else {
        return node;
      }
    }
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  // Inside an if's branches or a conditional expression, where jinja2 reports an unknown filter
  // or test only when it is reached; elsewhere it is an error before rendering.
  int soft_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse(std::string_view source) {
  // jinja2 reads \r\n and \r as \n and, without keep_trailing_newline, drops the source's
  // last newline.
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] != '\r') {
      normalized += source[i];
      continue;
    }
    normalized += '\n';
    if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  return Parser(Lexer(normalized).run()).parse_template();
}

}  // namespace strata::jinja
