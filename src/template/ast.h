// The parsed template: what the parser builds and the renderer walks.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "template/value.h"

namespace strata::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,  // literal
    Name,     // name
    List,     // args: the items; name "tuple" for a tuple
    Dict,     // args: key, value, key, value, ...
    Attr,     // args[0].name
    Item,     // args[0][args[1]]
    Slice,    // args[0][args[1]:args[2]:args[3]], absent bounds null
    Call,     // args[0](args[1..], kwargs)
    Filter,   // args[0] | name(args[1..], kwargs); args[0] null in a filter block
    Test,     // args[0] is [not] name(args[1..], kwargs)
    Unary,    // name: "-", "+", "not"
    Binary,   // name: the operator; "not in" for a negated membership
    And,
    Or,
    Cond,  // args[0] if args[1] else args[2] (null: Undefined)
  };
  Kind kind;
  int line;
  Value literal;
  std::string name;
  bool negated = false;  // Test
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    Text,         // text
    Output,       // {{ expr }}
    If,           // branches, a null condition for else
    For,          // for targets in expr [if condition]: body [else else_body]
    Set,          // set target = expr
    SetBlock,     // set target: the rendered body
    Macro,        // macro name(params = defaults): body
    FilterBlock,  // expr (a Filter chain whose innermost input is null) over the rendered body
    Break,
    Continue,
  };
  Kind kind;
  int line;
  std::string text;
  ExprPtr expr;
  ExprPtr target;
  ExprPtr condition;
  std::vector<std::string> names;  // For targets, Macro parameters
  std::vector<ExprPtr> defaults;   // Macro: one per parameter, null when it has none
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
};

// Filters and tests are looked up when the template is parsed, as jinja2 does, so that an unknown
// one is an error before anything renders.
bool has_filter(std::string_view name);
bool has_test(std::string_view name);

struct Program {
  Body body;
};

Body parse(std::string_view source);

}  // namespace strata::jinja
