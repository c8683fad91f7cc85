// Unit tests of the Jinja engine and ChatTemplate (expected outputs are jinja2's, checked
// by hand; tests/jinja/test_synthetic.py compares many more against live jinja2).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja/jinja.h"
#include "tokenizer/jinja/value.h"

using moeserve::ChatTemplate;
using moeserve::ChatTemplateInputs;
using moeserve::jinja::CompiledTemplate;
using json = nlohmann::ordered_json;

namespace {

std::string R(const std::string& src, const json& ctx = json::object()) {
  return CompiledTemplate::compile(src).render(ctx);
}

// Returns the error message of compiling + rendering, or "" when it succeeded.
std::string Err(const std::string& src, const json& ctx = json::object()) {
  try {
    R(src, ctx);
  } catch (const moeserve::Error& e) {
    return e.what();
  }
  return "";
}

TEST(JinjaExpr, ArithmeticAndPythonStr) {
  EXPECT_EQ(R("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 10 / 4 }} {{ 2 ** 3 ** 2 }}"), "3 -4 2 2.5 64");
  EXPECT_EQ(R("{{ 1.0 }} {{ 1e16 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ none }} {{ true }}"),
            "1.0 1e+16 1e-05 0.30000000000000004 None True");
  EXPECT_EQ(R("{{ [1, 'a', none, (2,)] }} {{ {'k': \"it's\"} }}"), "[1, 'a', None, (2,)] {'k': \"it's\"}");
  EXPECT_EQ(R("{{ 'a' ~ 1 ~ none }}"), "a1None");
}

TEST(JinjaExpr, ComparisonsLogicConditional) {
  EXPECT_EQ(R("{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'b' in 'abc' }} {{ 3 not in [1, 2] }}"), "True True True True");
  EXPECT_EQ(R("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ not [] }}"), "x y True");
  EXPECT_EQ(R("{{ 'a' if false else 'b' }}[{{ 'a' if false }}]"), "b[]");
}

TEST(JinjaExpr, AccessSlicingMethods) {
  json ctx = {{"m", {{"role", "user"}, {"list", {1, 2, 3}}}}, {"s", "  héllo  "}};
  EXPECT_EQ(R("{{ m.role }} {{ m['list'][-1] }} {{ m.list[::-1] }} {{ m.list[1:] }} [{{ m.nope }}]", ctx),
            "user 3 [3, 2, 1] [2, 3] []");
  EXPECT_EQ(R("[{{ s.strip() }}] {{ s.strip()[::-1] }} {{ 'a,b'.split(',') }} {{ s.strip().upper() }}", ctx),
            "[héllo] olléh ['a', 'b'] HÉLLO");
  EXPECT_EQ(R("{% for k, v in m.items() %}{{ k }};{% endfor %}{{ m.get('x', 5) }}", ctx), "role;list;5");
  EXPECT_EQ(R("{{ '<think>r</think>c'.split('</think>')[-1] }}"), "c");
}

TEST(JinjaFilters, TojsonMatchesPythonJsonDumps) {
  json ctx = json::parse(R"({"d": {"b": 1, "a": [1.5, null, true, "é\n\"x\""], "e": {}}})");
  EXPECT_EQ(R("{{ d | tojson }}", ctx), R"({"b": 1, "a": [1.5, null, true, "é\n\"x\""], "e": {}})");
  EXPECT_EQ(R("{{ d | tojson(indent=1, sort_keys=true) }}", ctx),
            "{\n \"a\": [\n  1.5,\n  null,\n  true,\n  \"é\\n\\\"x\\\"\"\n ],\n \"b\": 1,\n \"e\": {}\n}");
  EXPECT_EQ(R("{{ ['é'] | tojson(ensure_ascii=true) }}"), "[\"\\u00e9\"]");
  EXPECT_EQ(R("{{ {'a': 1} | tojson(separators=(',', ':')) }}"), "{\"a\":1}");
}

TEST(JinjaFilters, Common) {
  json ctx = {{"ms", json::array({{{"role", "user"}, {"c", "a"}}, {{"role", "tool"}, {"c", "b"}}})}};
  EXPECT_EQ(R("{{ ms | map(attribute='c') | join(',') }}", ctx), "a,b");
  EXPECT_EQ(R("{{ ms | selectattr('role', 'equalto', 'tool') | list | length }}", ctx), "1");
  EXPECT_EQ(R("{{ ms | rejectattr('role', 'eq', 'tool') | map(attribute='c') | first }}", ctx), "a");
  EXPECT_EQ(R("[{{ x | default('d') }}] [{{ '' | d('d', true) }}] [{{ '  t ' | trim }}] {{ 'ab' | length }}"),
            "[d] [d] [t] 2");
  EXPECT_EQ(R("{{ ['b', 'A', 'a'] | unique | list }} {{ '4' | int + 1 }} {{ -3 | abs }} {{ 'a\\nb' | indent(2) }}"),
            "['b', 'A'] 5 3 a\n  b");
}

TEST(JinjaTests, TypeTests) {
  json ctx = {{"s", "x"}, {"n", 1}, {"f", 1.5}, {"d", json::object()}, {"l", json::array()}, {"z", nullptr}};
  EXPECT_EQ(R("{{ s is string }}{{ n is integer }}{{ f is float }}{{ d is mapping }}{{ l is sequence }}", ctx),
            "TrueTrueTrueTrueTrue");
  EXPECT_EQ(R("{{ z is none }}{{ q is defined }}{{ q is undefined }}{{ true is boolean }}{{ n is number }}", ctx),
            "TrueFalseTrueTrueTrue");
  // jinja2 quirk: Undefined is iterable and a sequence, not a mapping.
  EXPECT_EQ(R("{{ q is iterable }}{{ q is sequence }}{{ q is mapping }}"), "TrueTrueFalse");
}

TEST(JinjaStatements, LoopsScopesNamespaces) {
  EXPECT_EQ(R("{% for x in [1,2,3] %}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.revindex }};{% endfor %}"),
            "1TrueFalse3;2FalseFalse2;3FalseTrue1;");
  EXPECT_EQ(R("{% set a = 0 %}{% for x in [1,2] %}{% set a = x %}{% endfor %}{{ a }}"), "0");
  EXPECT_EQ(R("{% set ns = namespace(a=0) %}{% for x in [1,2] %}{% set ns.a = ns.a + x %}{% endfor %}{{ ns.a }}"), "3");
  EXPECT_EQ(R("{% for x in [1,2,3,4] if x is odd %}{{ x }}{{ loop.length }}{% else %}-{% endfor %}"), "1232");
  EXPECT_EQ(R("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "1");
  EXPECT_EQ(R("{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m('A') }}{{ m(1, b=2) }}"), "AB12");
  EXPECT_EQ(R("{% generation %}g{% endgeneration %}"), "g");
}

TEST(JinjaWhitespace, TrimAndLstripBlocks) {
  EXPECT_EQ(R("a\n  {% if true %}\n  b\n  {% endif %}\nc"), "a\n  b\nc");
  EXPECT_EQ(R("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(R("x\n  {{- 1 -}}\n  y"), "x1y");
  EXPECT_EQ(R("a\n{# c #}\nb\n"), "a\nb");  // comment line removed, trailing newline dropped
  EXPECT_EQ(R("  {%+ if true %}k{% endif %}"), "  k");
}

TEST(JinjaErrors, SyntaxErrorsCarryLineNumbers) {
  EXPECT_EQ(Err("ok\n{% if x %}\nnever closed"), "line 3: unexpected end of template, expected 'elif' or 'else' or 'endif'");
  EXPECT_EQ(Err("a\nb\n{{ 1 + }}"), "line 3: unexpected end of print statement");
  EXPECT_EQ(Err("{% frobnicate %}"), "line 1: encountered unknown tag 'frobnicate'");
  EXPECT_NE(Err("{{ 'abc }}").find("line 1: unterminated string"), std::string::npos);
  EXPECT_NE(Err("\n{{ '\\xZZ' }}").find("line 2: truncated"), std::string::npos);
  EXPECT_NE(Err("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("too deep"), std::string::npos);
  EXPECT_NE(Err("{{ " + std::string(5000, '-') + "1 }}").find("too deep"), std::string::npos);
}

TEST(JinjaErrors, RuntimeErrorsCarryLineNumbers) {
  EXPECT_EQ(Err("\n\n{{ x | nosuch }}"), "line 3: No filter named 'nosuch'.");
  EXPECT_EQ(Err("\n{{ raise_exception('bad input') }}"), "line 2: bad input");
  EXPECT_EQ(Err("{{ undefined_thing.attr }}"), "line 1: 'undefined_thing' is undefined");
  EXPECT_EQ(Err("\n{{ 'a' + 1 }}"), "line 2: unsupported operand type(s) for +: 'str' and 'int'");
  EXPECT_EQ(Err("{{ [1].append(2) }}"), "line 1: access to attribute 'append' of 'list' object is unsafe.");
  EXPECT_NE(Err("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}").find("recursion"), std::string::npos);
}

TEST(JinjaValue, PythonFloatRepr) {
  using moeserve::jinja::py_float_repr;
  EXPECT_EQ(py_float_repr(100.0), "100.0");
  EXPECT_EQ(py_float_repr(1e21), "1e+21");
  EXPECT_EQ(py_float_repr(1234567890123456.0), "1234567890123456.0");
  EXPECT_EQ(py_float_repr(12345678901234567.0), "1.2345678901234568e+16");
  EXPECT_EQ(py_float_repr(0.0001), "0.0001");
  EXPECT_EQ(py_float_repr(-2.5e-7), "-2.5e-07");
}

TEST(ChatTemplate, RendersInputsAndKwargs) {
  auto t = ChatTemplate::compile(
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
      "{% if tools is none %}[no tools]{% endif %}{% if add_generation_prompt %}<assistant>{% endif %}"
      "{% if enable_thinking is defined and enable_thinking is false %}/no_think{% endif %}");
  ChatTemplateInputs in;
  in.messages = json::parse(R"([{"role":"user","content":"hi"}])");
  in.add_generation_prompt = true;
  in.bos_token = "<s>";
  in.extra = {{"enable_thinking", false}};
  EXPECT_EQ(t.render(in), "<s><user>hi[no tools]<assistant>/no_think");
}

TEST(ChatTemplate, TokenizerConfigLoadsTokensAndNamedTemplates) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / "moeserve_jinja_cfg_test";
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "tokenizer_config.json");
    f << R"({"bos_token": {"__type": "AddedToken", "content": "<B>"}, "eos_token": "<E>", "add_bos_token": true,
            "chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]})";
  }
  auto cfg = moeserve::TokenizerConfig::load(dir.string());
  EXPECT_EQ(cfg.bos_token, "<B>");
  EXPECT_EQ(cfg.eos_token, "<E>");
  EXPECT_TRUE(cfg.add_bos_token);
  EXPECT_EQ(cfg.template_for(false), "D");
  EXPECT_EQ(cfg.template_for(true), "T");
  {
    std::ofstream f(dir / "chat_template.jinja");
    f << "J";
  }
  EXPECT_EQ(moeserve::TokenizerConfig::load(dir.string()).template_for(true), "J");
  fs::remove_all(dir);
}

TEST(JinjaExpr, NonStringDictKeys) {
  EXPECT_EQ(R("{% set m = {0: 0, 512: 128} %}{{ m[512] }} {{ 512 in m }} {{ m }} {{ m | tojson }}"),
            "128 True {0: 0, 512: 128} {\"0\": 0, \"512\": 128}");
  EXPECT_EQ(R("{% for k, v in {2: 'b', 1: 'a'} | dictsort %}{{ k + 1 }}{{ v }}{% endfor %}"), "2a3b");
  EXPECT_EQ(R("{{ {none: 1, 1: 2, true: 3} | tojson }}"), "{\"null\": 1, \"1\": 3}");
  EXPECT_EQ(Err("{{ {[1]: 2} }}"), "line 1: unhashable type: 'list'");
}

TEST(JinjaExpr, MarkupConcatenationEscapesPlainSide) {
  EXPECT_EQ(R("{{ 'a<' | safe + '<b>' }}|{{ '<' + '&' | safe }}|{{ ('<' | e) ~ '>' }}"), "a<&lt;b&gt;|&lt;&|&lt;>");
}

TEST(JinjaExpr, PythonFormatting) {
  EXPECT_EQ(R("{{ '%5.2f|%-3s|%03d|%x|%(a)s' % (3.14159, 'a', 7, 255, 1) if false else '%5.2f|%-3s|%03d|%x' % (3.14159, 'a', 7, 255) }}"),
            " 3.14|a  |007|ff");
  EXPECT_EQ(R("{{ '{:>4}|{:<3}|{:^5}|{:.1f}|{:,}|{!r}'.format('ab', 'c', 'm', 2.25, 1234567, 'q') }}"),
            "  ab|c  |  m  |2.2|1,234,567|'q'");
  EXPECT_EQ(R("{{ '%s-%s' | format('a', 1) }}"), "a-1");
}

TEST(JinjaFilters, SequenceFilters) {
  json ctx = {{"u", json::parse(R"([{"n":"a","r":"x"},{"n":"b","r":"y"},{"n":"c","r":"x"}])")}};
  EXPECT_EQ(R("{% for g in u | groupby('r') %}{{ g.grouper }}={{ g.list | map(attribute='n') | join }};{% endfor %}", ctx),
            "x=ac;y=b;");
  EXPECT_EQ(R("{{ [1, 2, 3] | batch(2, 0) | list }} {{ [1, 2, 3] | slice(2) | list }}"), "[[1, 2], [3, 0]] [[1, 2], [3]]");
  EXPECT_EQ(R("{{ 'one two_three 4' | wordcount }} {{ 'hello world foo' | truncate(9) }}"), "3 hello...");
  EXPECT_EQ(R("{% for x in [1, 1, 2] %}{{ loop.changed(x) }}{% endfor %}"), "TrueFalseTrue");
  EXPECT_EQ(R("{{ none | map('upper') | list }} {{ none | selectattr('x') | list }}"), "[] []");
}

TEST(JinjaErrors, MacroDefaultOrder) {
  EXPECT_EQ(Err("\n{% macro m(a=1, b) %}{% endmacro %}"), "line 2: non-default argument follows default argument");
}

TEST(ChatTemplate, MiniMaxTemplateRendersToolCall) {
  const char* root = std::getenv("MOESERVE_SHARED_DATA");
  std::filesystem::path p = std::filesystem::path(root ? root : MOESERVE_TEST_SHARED_DATA) / "chat-templates/minimax-m2.jinja";
  ASSERT_TRUE(std::filesystem::exists(p)) << "missing test data " << p;
  std::ifstream f(p);
  std::string src((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ChatTemplateInputs in;
  in.messages = json::parse(R"([{"role":"user","content":"w?"},
    {"role":"assistant","content":"","tool_calls":[{"function":{"name":"get","arguments":{"city":"Oslo","n":2}}}]},
    {"role":"tool","content":"cold"}])");
  in.add_generation_prompt = true;
  std::string out = ChatTemplate::compile(src).render(in);
  EXPECT_NE(out.find("<invoke name=\"get\">\n<parameter name=\"city\">Oslo</parameter>\n<parameter name=\"n\">2</parameter>\n</invoke>"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("]~b]tool\n<response>cold</response>[e~[\n]~b]ai\n<think>\n"), std::string::npos) << out;
}

}  // namespace
