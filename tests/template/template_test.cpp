// The renderer's pieces, each against what Python's jinja2 (as Hugging Face sets it up) prints
// for the same template.
#include <gtest/gtest.h>

#include "template/jinja.h"

namespace {

using strata::jinja::RaisedError;
using strata::jinja::Template;
using strata::jinja::TemplateError;

std::tm fixed_date() {
  std::tm t{};
  t.tm_year = 2026 - 1900;
  t.tm_mon = 2;
  t.tm_mday = 7;
  t.tm_wday = 6;
  return t;
}

std::string render(std::string_view source, const char* context = "{}") {
  return Template(source).render(nlohmann::ordered_json::parse(context), fixed_date());
}

TEST(Template, WhitespaceControl) {
  EXPECT_EQ(render("a  {{- 'b' -}}  \n c"), "abc");
  EXPECT_EQ(render("a\n  {%- if true %}b{% endif %}"), "ab");
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: so does its indentation.
  EXPECT_EQ(render("x\n  {% if true %}\n  y\n  {% endif %}\nz"), "x\n  y\nz");
  // Not for {{ }}, and not when text precedes the tag on its line.
  EXPECT_EQ(render("  {{ 1 }}\nx"), "  1\nx");
  EXPECT_EQ(render("a {% if true %}b{% endif %}"), "a b");
  EXPECT_EQ(render("  {# note #}\nx"), "x");
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");
  // The source's last newline goes, and \r\n reads as \n.
  EXPECT_EQ(render("{{ 1 }}  \r\n{{ 2 }}\n"), "1  \n2");
}

TEST(Template, LoopVariables) {
  EXPECT_EQ(render("{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
                   "{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}"),
            "103TrueFalse3;212FalseFalse3;321FalseTrue3;");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.previtem is defined }}{{ loop.nextitem | "
                   "default('-') }} {% endfor %}"),
            "False2 True3 True- ");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}"),
            "2242");
  EXPECT_EQ(render("{% for x in range(5) %}{% if x == 1 %}{% continue %}{% endif %}"
                   "{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "02");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}"),
            "a=1,b=2,");
}

TEST(Template, Scoping) {
  // A set in a loop stays in the loop; a namespace carries it out.
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace(x=1) %}{% for i in [1] %}{% set ns.x = 2 %}{% endfor "
                   "%}{{ ns.x }}"),
            "2");
  EXPECT_EQ(render("{% set block %}a{{ 1 + 1 }}{% endset %}[{{ block }}]"), "[a2]");
  EXPECT_EQ(render("{% macro m(a, b='d') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(1, b=2) }}"),
            "1d12");
  EXPECT_EQ(render("{% filter upper %}abc{% endfilter %}"), "ABC");
}

TEST(Template, Expressions) {
  EXPECT_EQ(
      render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }}"),
      "3 -4 1 3.5 1024 7");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none }} {{ 'a' + 'b' }} {{ [1] + [2] }}"), "a1None ab [1, 2]");
  EXPECT_EQ(
      render("{{ 'abcdef'[1:3] }} {{ 'abc'[::-1] }} {{ [1, 2, 3][-1] }} {{ [1, 2, 3][:-1] }}"),
      "bc cba 3 [1, 2]");
  EXPECT_EQ(render("{{ 'b' in 'abc' }} {{ 2 not in [1, 2] }} {{ 'k' in {'k': 1} }}"),
            "True False True");
  EXPECT_EQ(render("{{ 'yes' if 1 < 2 else 'no' }}{{ 'x' if false }}"), "yes");
  EXPECT_EQ(render("{{ not 1 == 2 and (none or 'z') }}"), "z");
  // Filters bind tighter than arithmetic.
  EXPECT_EQ(render("{{ [1, 2, 3] | length - 1 }}"), "2");
  EXPECT_EQ(render("{{ {'a': 'x', 'b': [1.5, true, none]} }}"),
            "{'a': 'x', 'b': [1.5, True, None]}");
  EXPECT_EQ(render("{{ 1e20 }} {{ 0.1 + 0.2 }} {{ 1.0 }}"), "1e+20 0.30000000000000004 1.0");
}

TEST(Template, UndefinedIsEmptyAndFalsy) {
  EXPECT_EQ(render("[{{ missing }}]{% if missing %}x{% endif %}{{ missing | length }}"), "[]0");
  EXPECT_EQ(render("{{ m.content is defined }}", R"({"m": {}})"), "False");
  EXPECT_EQ(render("{{ missing is defined }}{{ missing is undefined }}"), "FalseTrue");
  // Looking something up on Undefined is an error, as in jinja2.
  EXPECT_THROW(render("{{ missing.attr }}"), TemplateError);
}

TEST(Template, Methods) {
  EXPECT_EQ(render("{{ '  a b  '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ "
                   "' a  b '.split() }}"),
            "a b|axx|['a', 'b', '', 'c']|['a', 'b']");
  EXPECT_EQ(render("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ "
                   "'aXa'.replace('a', 'b') }}"),
            "TrueTruebXb");
  EXPECT_EQ(
      render("{{ d.get('a') }}{{ d.get('z', 5) }}{{ d.keys() | list }}{{ d.values() | list }}",
             R"({"d": {"a": 1}})"),
      "15['a'][1]");
  // The immutable sandbox: no method may change a list or dict.
  EXPECT_THROW(render("{% set l = [] %}{{ l.append(1) }}"), TemplateError);
}

TEST(Template, Filters) {
  EXPECT_EQ(render("{{ d | tojson }}", R"({"d": {"b": "é", "a": [1, 2.5, null]}})"),
            R"({"b": "é", "a": [1, 2.5, null]})");
  EXPECT_EQ(render("{{ d | tojson(ensure_ascii=True) }}", R"({"d": "é🦙"})"),
            R"("\u00e9\ud83e\udd99")");
  EXPECT_EQ(render("{{ d | tojson(indent=2) }}", R"({"d": {"a": [1], "b": {}}})"),
            "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}");
  EXPECT_EQ(render("{{ '  x ' | trim }}{{ none | string }}{{ missing | default('d') }}{{ '' | "
                   "default('e', true) }}"),
            "xNonede");
  EXPECT_EQ(render("{{ 'straße ÿ δ жё' | upper }} {{ 'ÀÉ ΣΑ ЖЁ Ł' | lower }}"),
            "STRASSE Ÿ Δ ЖЁ àé σα жё ł");
  EXPECT_EQ(render("{{ [1, 2] | join(', ') }} {{ [3, 1, 2] | sort | first }} {{ [1, 2] | last }} "
                   "{{ 'ab' | upper }}"),
            "1, 2 1 2 AB");
  EXPECT_EQ(render("{{ {'b': 1, 'A': 2} | dictsort }}"), "[('A', 2), ('b', 1)]");
  EXPECT_EQ(
      render(
          "{% set d = {512: 'x', 0: 'y'} %}{{ d[512] }}{{ d | dictsort | first }}{{ d | tojson }}"),
      "x(0, 'y'){\"512\": \"x\", \"0\": \"y\"}");
  // select, map and unique give generators: true however empty, without a length or JSON.
  EXPECT_EQ(render("{{ 'yes' if [] | select }}"), "yes");
  EXPECT_THROW(render("{{ [1] | map('string') | tojson }}"), TemplateError);
  EXPECT_THROW(render("{{ [1] | unique | length }}"), TemplateError);
  EXPECT_EQ(
      render(
          "{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='c') | list }}",
          R"({"ms": [{"role": "user", "c": 1}, {"role": "x", "c": 2}, {"role": "user", "c": 3}]})"),
      "[1, 3]");
  EXPECT_EQ(render("{{ ['a', 'b'] | map('upper') | join }} {{ [1, 1, 2] | unique | list }} {{ '3' "
                   "| int + 1 }}"),
            "AB [1, 2] 4");
  EXPECT_EQ(render("{{ 'a\nb\n' | indent(2) }}|{{ 'a\nb' | indent(2, first=true) }}"),
            "a\n  b\n|  a\n  b");
  // markupsafe: a plain string added to a safe one is escaped.
  EXPECT_EQ(render("{{ '<a>' | safe + '<b>' }} {{ '<a>' | safe ~ '<b>' }}"), "<a>&lt;b&gt; <a><b>");
}

TEST(Template, Globals) {
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}"), "07 Mar 2026");
  try {
    render("{{ raise_exception('No system messages, please.') }}");
    FAIL() << "raise_exception did not raise";
  } catch (const RaisedError& e) {
    EXPECT_STREQ(e.what(), "No system messages, please.");
  }
}

TEST(Template, StrictAtParseTime) {
  auto parse_error = [](std::string_view source) {
    try {
      Template t(source);
    } catch (const TemplateError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(parse_error("a\n{% include 'x' %}"),
            "template line 2: unsupported statement 'include'");
  EXPECT_EQ(parse_error("{{ x | nosuchfilter }}"),
            "template line 1: unsupported filter 'nosuchfilter'");
  EXPECT_EQ(parse_error("{% for x in y recursive %}{% endfor %}"),
            "template line 1: unsupported: recursive for loops");
  EXPECT_EQ(parse_error("\n\n{% if x %}"),
            "template line 3: unexpected end of template, expected 'endif'");
  // Inside a branch jinja2 reports an unknown filter only when the branch runs.
  EXPECT_EQ(parse_error("{% if x %}{{ x | nosuchfilter }}{% endif %}"), "no error");
  EXPECT_THROW(render("{% if true %}{{ 1 | nosuchfilter }}{% endif %}"), TemplateError);
}

}  // namespace
