#include "constrain/json_schema.h"

#include <gtest/gtest.h>

#include "constrain/grammar.h"
#include "constrain/matcher.h"

namespace strata::constrain {
namespace {

using json = nlohmann::ordered_json;

bool accepts_text(const std::string& grammar, const std::string& text) {
  Matcher m(parse_gbnf(grammar), std::make_shared<const Vocabulary>(std::vector<std::string>{}, std::vector<Token>{}));
  return m.accept_bytes(text) && m.complete();
}

bool accepts(const char* schema, const std::string& text) {
  return accepts_text(json_schema_grammar(json::parse(schema)), text);
}

std::string refusal(const char* schema) {
  try {
    json_schema_grammar(json::parse(schema));
  } catch (const SchemaError& e) {
    return e.what();
  }
  return "accepted";
}

// Instances written by hand: what a schema accepts and what it must not.
struct Case {
  const char* schema;
  std::vector<std::string> valid;
  std::vector<std::string> invalid;
};

class SchemaCases : public testing::TestWithParam<Case> {};

TEST_P(SchemaCases, AcceptsTheValidAndRejectsTheInvalid) {
  const Case& c = GetParam();
  for (const std::string& text : c.valid) EXPECT_TRUE(accepts(c.schema, text)) << c.schema << " should accept " << text;
  for (const std::string& text : c.invalid) EXPECT_FALSE(accepts(c.schema, text)) << c.schema << " should reject " << text;
}

INSTANTIATE_TEST_SUITE_P(
    Keywords, SchemaCases,
    testing::Values(
        Case{R"({"type":"string"})", {R"("")", R"("héllo \"q\" \u00e9\n")"}, {R"(abc)", "\"a\nb\"", R"("\x")", R"("a)"}},
        Case{R"({"type":"string","minLength":2,"maxLength":3})", {R"("ab")", R"("a\"c")", R"("ééé")"}, {R"("a")", R"("abcd")"}},
        Case{R"({"type":"integer"})", {"0", "-7", "1234567890123456"}, {"01", "1.5", "-", "12345678901234567", "+1"}},
        Case{R"({"type":"number"})", {"0.5", "-3e10", "2E-3", "7"}, {".5", "1.", "1e", "NaN"}},
        Case{R"({"type":"integer","minimum":-15,"maximum":123})", {"-15", "-1", "0", "9", "99", "100", "123"},
             {"-16", "124", "200", "-0", "1000"}},
        Case{R"({"type":"integer","exclusiveMinimum":10,"exclusiveMaximum":20})", {"11", "19"}, {"10", "20", "5"}},
        Case{R"({"type":"integer","minimum":1000})", {"1000", "5555", "99999"}, {"999", "0", "-1000"}},
        Case{R"({"type":"boolean"})", {"true", "false"}, {"True", "1"}},
        Case{R"({"type":"null"})", {"null"}, {"nul", ""}},
        Case{R"({"type":["string","null"]})", {R"("x")", "null"}, {"1"}},
        Case{R"({"enum":["red","green",3,null]})", {R"("red")", R"("green")", "3", "null"}, {R"("blue")", "4"}},
        Case{R"({"const":{"a":[1,2]}})", {R"({"a":[1,2]})"}, {R"({"a":[1]})"}},
        Case{R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})", {"[1]", "[1, 2,3]", "[ 1 , 2 ]"},
             {"[]", "[1,2,3,4]", "[1,]", R"(["a"])", "[1,\n2]", "[1,  2]", " [1]"}},
        Case{R"({"type":"array","maxItems":0})", {"[]", "[ ]"}, {"[1]"}},
        Case{R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["b"]})",
             {R"({"b":"x"})", R"({"a":1,"b":"x"})", R"({ "a" : 1 , "b" : "" })"},
             {R"({"a":1})", R"({})", R"({"b":"x","a":1})", R"({"a":1,"b":"x","c":2})", R"({"b":1})"}},
        Case{R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}}})",
             {"{}", R"({"a":1})", R"({"b":2})", R"({"a":1,"b":2})"}, {R"({,"b":2})", R"({"a":1,})"}},
        Case{R"({"type":"object","additionalProperties":{"type":"integer"}})", {"{}", R"({"x":1,"y":2})"}, {R"({"x":"s"})"}},
        Case{R"({"type":"object","additionalProperties":false})", {"{}"}, {R"({"x":1})"}},
        Case{R"({"type":"object"})", {"{}", R"({"x":[1,{"y":null}],"z":"w"})"}, {"[]"}},
        Case{R"({"anyOf":[{"type":"integer"},{"type":"array","items":{"type":"boolean"}}]})", {"5", "[true]"}, {R"("s")"}},
        Case{R"({"oneOf":[{"const":"a"},{"const":"b"}]})", {R"("a")", R"("b")"}, {R"("c")"}},
        Case{R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}},"$ref":"#/$defs/node"})",
             {R"({"v":1,"next":null})", R"({"v":1,"next":{"v":2,"next":null}})"}, {R"({"v":1,"next":{"v":2}})"}},
        Case{R"({"definitions":{"n":{"type":"integer"}},"type":"array","items":{"$ref":"#/definitions/n"}})", {"[1,2]"}, {R"(["1"])"}},
        Case{R"({"title":"T","description":"d","examples":[1],"default":1,"$schema":"x","type":"integer"})", {"1"}, {"a"}},
        Case{"true", {"1", R"({"a":[]})"}, {"{"}},
        Case{R"({"type":"object","required":["x"]})", {R"({"x":[1]})"}, {"{}"}}));

// Integer ranges are built digit by digit; every integer near them is checked against the bounds.
TEST(IntegerRanges, AcceptExactlyTheIntegersWithinTheBounds) {
  const std::vector<std::pair<int, int>> ranges = {{0, 0},     {0, 9},      {3, 7},     {-9, 9},    {-15, 123},
                                                   {10, 99},   {100, 999},  {99, 101},  {-1000, -1}, {-205, -37},
                                                   {1, 1000},  {45, 1099},  {-1099, 7}, {0, 1234},   {19, 91}};
  for (const auto& [low, high] : ranges) {
    json schema = {{"type", "integer"}, {"minimum", low}, {"maximum", high}};
    const std::string grammar = json_schema_grammar(schema);
    for (int n = -1300; n <= 1300; ++n) {
      ASSERT_EQ(accepts_text(grammar, std::to_string(n)), low <= n && n <= high) << n << " in [" << low << ", " << high << "]";
    }
  }
  json only_minimum = {{"type", "integer"}, {"exclusiveMinimum", 41.5}};
  const std::string grammar = json_schema_grammar(only_minimum);
  for (int n = -100; n <= 2000; ++n) ASSERT_EQ(accepts_text(grammar, std::to_string(n)), n >= 42) << n;
  EXPECT_TRUE(accepts_text(grammar, "9999999999999999"));
}

TEST(SchemaRefusals, NameTheProblem) {
  EXPECT_NE(refusal(R"({"type":"string","pattern":"^a"})").find("unsupported keyword: pattern"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","format":"date","foo":1})").find("unsupported keywords: format, foo"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"strin"})").find("/type"), std::string::npos);
  EXPECT_NE(refusal(R"({"$ref":"#/$defs/missing"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(refusal(R"({"$ref":"http://x/y"})").find("only references within"), std::string::npos);
  EXPECT_NE(refusal(R"({"$ref":"#"})").find("left recursion"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"array","minItems":3,"maxItems":2})").find("maxItems is below minItems"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","maxLength":-1})").find("/maxLength"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"integer","minimum":5,"maximum":4})").find("no integer"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"number","minimum":0.5})").find("integers only"), std::string::npos);
  EXPECT_NE(refusal(R"({"properties":{"a":{"type":"nope"}}})").find("/properties/a/type"), std::string::npos);
  EXPECT_NE(refusal("false").find("accepts nothing"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"object","required":["a"],"additionalProperties":false})").find("'a' is required"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","enum":[1]})").find("does not have the schema's type"), std::string::npos);
  EXPECT_NE(refusal(R"({"anyOf":[{"type":"integer"}],"type":"string"})").find("anyOf together with type"), std::string::npos);
  // A chain of references is as deep as the schemas it goes through.
  json chain = {{"$ref", "#/$defs/d0"}};
  for (int i = 0; i < 100; ++i) chain["$defs"]["d" + std::to_string(i)] = {{"$ref", "#/$defs/d" + std::to_string(i + 1)}};
  chain["$defs"]["d100"] = {{"type", "null"}};
  EXPECT_THROW(json_schema_grammar(chain), SchemaError);
  chain["$ref"] = "#/$defs/d90";
  EXPECT_TRUE(accepts_text(json_schema_grammar(chain), "null"));
}

TEST(JsonObjectGrammar, AcceptsAnyObjectOnly) {
  const std::string g = json_object_grammar();
  EXPECT_TRUE(accepts_text(g, R"({"a":{"b":[1,"c",true,null,-0.5e3]}})"));
  EXPECT_FALSE(accepts_text(g, R"([1])"));
  EXPECT_FALSE(accepts_text(g, R"({"a":})"));
}

TEST(WrappedJsonGrammar, PrefixSchemaSuffixAlternatives) {
  const std::string g = wrapped_json_grammar({
      {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ",
       json::parse(R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})"), "}\n</tool_call>"},
      {"<tool_call>\n{\"name\": \"now\", \"arguments\": ", json::parse(R"({"type":"object","additionalProperties":false})"),
       "}\n</tool_call>"},
  });
  EXPECT_TRUE(accepts_text(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"));
  EXPECT_TRUE(accepts_text(g, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(accepts_text(g, "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"));
  EXPECT_FALSE(accepts_text(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_THROW(wrapped_json_grammar({}), SchemaError);
}

}  // namespace
}  // namespace strata::constrain
