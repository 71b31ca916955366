// A context-free grammar over Unicode code points, the form every constraint on generated text
// takes (JSON schemas compile to it, GBNF text parses into it), and the GBNF reader. Repetition
// and groups are rewritten into plain rules, so a rule is alternatives of sequences of
// character classes and references to rules.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace strata::constrain {

// Thrown for grammar text that cannot be read, or a grammar that cannot be matched (a rule used
// but not defined, left recursion); the message says what and where.
struct GrammarError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct CodepointRange {
  char32_t first;
  char32_t last;
};

// One position of a sequence: a class of code points (`negated`: any code point outside the
// ranges) or a reference to a rule.
struct Element {
  enum class Kind : uint8_t { Chars, Rule };
  Kind kind = Kind::Chars;
  bool negated = false;
  std::vector<CodepointRange> ranges;
  int rule = -1;

  bool matches(char32_t cp) const;
  // Whether some code point of [first, last] matches; whether all do.
  bool matches_any(char32_t first, char32_t last) const;
  bool matches_all(char32_t first, char32_t last) const;
};

using Sequence = std::vector<Element>;

struct Rule {
  std::string name;
  std::vector<Sequence> alternatives;
};

struct Grammar {
  std::vector<Rule> rules;
  int root = -1;
};

// Reads GBNF as llama.cpp's grammars write it: `name ::= ...` rules of string literals with
// escapes (\n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH), character classes ([a-z], [^"\\]), `.`,
// groups, alternatives, the repetitions * + ? {m} {m,} {m,n}, and # comments. The rule `root`
// is where matching starts. Throws GrammarError.
Grammar parse_gbnf(std::string_view text);

}  // namespace strata::constrain
