#include "constrain/grammar.h"

#include <gtest/gtest.h>

#include "constrain/matcher.h"

namespace strata::constrain {
namespace {

// Whether the grammar accepts exactly `text` (matched byte by byte, then complete).
bool accepts(const std::string& grammar, const std::string& text) {
  Matcher m(parse_gbnf(grammar), std::make_shared<const Vocabulary>(std::vector<std::string>{}, std::vector<Token>{}));
  return m.accept_bytes(text) && m.complete();
}

TEST(Gbnf, LiteralsAlternativesAndGroups) {
  const std::string g = "root ::= \"a\" (\"b\" | \"cd\") \"e\"\n";
  EXPECT_TRUE(accepts(g, "abe"));
  EXPECT_TRUE(accepts(g, "acde"));
  EXPECT_FALSE(accepts(g, "ace"));
  EXPECT_FALSE(accepts(g, "ab"));
  EXPECT_FALSE(accepts(g, "abee"));
}

TEST(Gbnf, Repetitions) {
  EXPECT_TRUE(accepts("root ::= \"x\"*", ""));
  EXPECT_TRUE(accepts("root ::= \"x\"*", "xxxx"));
  EXPECT_FALSE(accepts("root ::= \"x\"+", ""));
  EXPECT_TRUE(accepts("root ::= \"x\"+", "xxx"));
  EXPECT_TRUE(accepts("root ::= \"x\"? \"y\"", "y"));
  EXPECT_FALSE(accepts("root ::= \"x\"? \"y\"", "xxy"));
  const std::string bounded = "root ::= [0-9]{2,4}";
  EXPECT_FALSE(accepts(bounded, "1"));
  EXPECT_TRUE(accepts(bounded, "12"));
  EXPECT_TRUE(accepts(bounded, "1234"));
  EXPECT_FALSE(accepts(bounded, "12345"));
  EXPECT_TRUE(accepts("root ::= \"ab\"{3}", "ababab"));
  EXPECT_FALSE(accepts("root ::= \"ab\"{3}", "abab"));
  EXPECT_TRUE(accepts("root ::= \"a\"{2,}", "aaaaa"));
  EXPECT_FALSE(accepts("root ::= \"a\"{2,}", "a"));
}

TEST(Gbnf, ClassesEscapesAndUtf8) {
  const std::string g = "root ::= [^\"\\\\]* \"\\x21\" [α-ω] . \"\\u00e9\"\n";
  EXPECT_TRUE(accepts(g, "ab c!β😀é"));
  EXPECT_FALSE(accepts(g, "a\"!β😀é"));
  EXPECT_FALSE(accepts(g, "!a😀é"));  // 'a' is not a Greek small letter
  EXPECT_TRUE(accepts("root ::= [\\n\\t] [a-c-]", "\t-"));
  // Invalid UTF-8 is never accepted, even by '.'.
  EXPECT_FALSE(accepts("root ::= .", "\xC0\x80"));
  EXPECT_FALSE(accepts("root ::= .", "\xED\xA0\x80"));  // a surrogate
  EXPECT_TRUE(accepts("root ::= .", "\xF4\x8F\xBF\xBF"));
}

TEST(Gbnf, RulesRecursionCommentsAndLines) {
  const std::string g =
      "# balanced brackets\n"
      "root ::= item*   # any number\n"
      "item ::= \"[\" root \"]\"\n"
      "       | \"x\"\n";
  EXPECT_TRUE(accepts(g, "[[x]x][]"));
  EXPECT_FALSE(accepts(g, "[[x]"));
  EXPECT_TRUE(accepts("root ::= (\n  \"a\"\n  \"b\"\n)\n", "ab"));
}

TEST(Gbnf, ErrorsSayWhat) {
  const auto error = [](const std::string& g) {
    try {
      parse_gbnf(g);
    } catch (const GrammarError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error("root ::= foo").find("'foo' is used but not defined"), std::string::npos);
  EXPECT_NE(error("start ::= \"a\"").find("no rule 'root'"), std::string::npos);
  EXPECT_NE(error("root ::= \"a").find("unterminated"), std::string::npos);
  EXPECT_NE(error("root ::= [b-a]").find("ends before it starts"), std::string::npos);
  EXPECT_NE(error("root ::= root \"a\" | \"b\"").find("left recursion"), std::string::npos);
  EXPECT_NE(error("root ::= (\"a\"?)*").find("left recursion"), std::string::npos);
  EXPECT_NE(error("root ::= \"a\"{5,2}").find("below its minimum"), std::string::npos);
  EXPECT_NE(error("root ::= \"a\"{100000}").find("above"), std::string::npos);
  EXPECT_NE(error("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
  EXPECT_NE(error("root ::= \"\\q\"").find("unknown escape"), std::string::npos);
  EXPECT_NE(error("root ::= \"a\" )").find("')'"), std::string::npos);
  EXPECT_NE(error("root ::= \"\\uD800\"").find("no Unicode scalar"), std::string::npos);
}

TEST(Matcher, CompletionAndFinish) {
  Matcher m(parse_gbnf("root ::= \"ab\" \"c\"?"), std::make_shared<const Vocabulary>(std::vector<std::string>{}, std::vector<Token>{}));
  EXPECT_FALSE(m.complete());
  EXPECT_TRUE(m.accept_bytes("ab"));
  EXPECT_TRUE(m.complete());
  EXPECT_FALSE(m.finished());  // "c" may still come
  EXPECT_FALSE(m.accept_bytes("x"));
  EXPECT_TRUE(m.complete());  // a refused step changes nothing
  EXPECT_TRUE(m.accept_bytes("c"));
  EXPECT_TRUE(m.finished());
}

TEST(Matcher, PartialUtf8WaitsForTheRest) {
  Matcher m(parse_gbnf("root ::= [é] \"!\""), std::make_shared<const Vocabulary>(std::vector<std::string>{}, std::vector<Token>{}));
  EXPECT_FALSE(m.accepts("\xC3\xA8"));  // è
  EXPECT_FALSE(m.accepts("\xC4"));      // no é starts so
  EXPECT_TRUE(m.accept_bytes("\xC3"));
  EXPECT_FALSE(m.complete());
  EXPECT_TRUE(m.accept_bytes("\xA9!"));
  EXPECT_TRUE(m.finished());
}

TEST(Matcher, TooAmbiguousGrammarIsAnErrorNotAHang) {
  // After n a's, any number up to n of b's may be owed: n + 1 parses.
  Matcher m(parse_gbnf("root ::= \"a\" root \"b\" | \"a\" root | \"c\""),
            std::make_shared<const Vocabulary>(std::vector<std::string>{}, std::vector<Token>{}));
  EXPECT_TRUE(m.accept_bytes(std::string(100, 'a')));
  EXPECT_THROW(m.accept_bytes(std::string(Matcher::kMaxParses, 'a')), GrammarError);
}

TEST(Matcher, AChainOfRulesTooLongForTheStackIsAnError) {
  std::string g = "root ::= r0\n";
  for (int i = 0; i < 100'000; ++i) g += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
  g += "r100000 ::= \"a\"\n";
  const auto vocab = std::make_shared<const Vocabulary>(std::vector<std::string>{}, std::vector<Token>{});
  EXPECT_THROW(Matcher(parse_gbnf(g), vocab), GrammarError);
  // Shorter chains are fine.
  Matcher short_chain(parse_gbnf("root ::= a\na ::= b\nb ::= \"x\""), vocab);
  EXPECT_TRUE(short_chain.accept_bytes("x"));
}

}  // namespace
}  // namespace strata::constrain
