// Grammar IR, EBNF, regex and JSON Schema compilers: languages checked by matching byte
// strings (accept / reject) through the matcher with a one-byte-per-token vocabulary.
#include <gtest/gtest.h>

#include <chrono>

#include "structured/constraint.h"
#include "structured/json_schema.h"
#include "structured/regex.h"

#include "grammar_test_util.h"

using namespace moeserve::structured;
using namespace moeserve::structured::testing;

TEST(Ebnf, BasicLanguage) {
  Grammar g = parse_ebnf(R"(
    root ::= "a" item* ("x" | "yz")?  # comment
    item ::= [0-9] | "-"
  )");
  EXPECT_TRUE(matches(g, "a"));
  EXPECT_TRUE(matches(g, "a12-3x"));
  EXPECT_TRUE(matches(g, "ayz"));
  EXPECT_FALSE(matches(g, "ay"));
  EXPECT_FALSE(matches(g, "b"));
  EXPECT_FALSE(matches(g, "axx"));
}

TEST(Ebnf, RecursionAndRepeat) {
  Grammar g = parse_ebnf(R"G(root ::= "(" root ")" | [a-c]{2,3})G");
  EXPECT_TRUE(matches(g, "ab"));
  EXPECT_TRUE(matches(g, "((abc))"));
  EXPECT_FALSE(matches(g, "((ab)"));
  EXPECT_FALSE(matches(g, "a"));
  EXPECT_FALSE(matches(g, "abcd"));
}

TEST(Ebnf, UnicodeClassesAreUtf8) {
  Grammar g = parse_ebnf(R"(root ::= [^a]+ "é")");
  EXPECT_TRUE(matches(g, "ü€😀é"));
  EXPECT_FALSE(matches(g, "aé"));
  EXPECT_FALSE(matches(g, "\xff\xfe\xc3\xa9"));  // invalid UTF-8 is not a character
}

TEST(Ebnf, ErrorsCarryPositions) {
  auto pos_of = [](const std::string& text) -> std::optional<size_t> {
    try {
      parse_ebnf(text);
    } catch (const GrammarError& e) {
      return e.position();
    }
    return std::nullopt;
  };
  EXPECT_EQ(pos_of("root ::= \"abc"), 13u);
  EXPECT_TRUE(pos_of("root ::= missing").has_value());
  EXPECT_THROW(parse_ebnf("other ::= \"x\""), GrammarError);          // no root
  EXPECT_THROW(parse_ebnf("root ::= root \"x\" | \"y\""), GrammarError);  // left recursion
  EXPECT_THROW(parse_ebnf("root ::= (= \"x\") \"x\""), GrammarError);   // lookahead
  EXPECT_THROW(parse_ebnf("root ::= \"x\"{5,2}"), GrammarError);
  EXPECT_THROW(parse_ebnf("root ::= [z-a]"), GrammarError);
  EXPECT_THROW(parse_ebnf(std::string(1000, '(') + "\"x\"" + std::string(1000, ')')), GrammarError);  // depth
}

TEST(Regex, Language) {
  EXPECT_TRUE(matches(grammar_from_regex(R"(^\d{3}-[a-f]+$)"), "123-abc"));
  EXPECT_FALSE(matches(grammar_from_regex(R"(\d{3}-[a-f]+)"), "12-abc"));
  EXPECT_TRUE(matches(grammar_from_regex("(cat|dog)s?"), "dogs"));
  EXPECT_FALSE(matches(grammar_from_regex("(cat|dog)s?"), "cow"));
  EXPECT_TRUE(matches(grammar_from_regex(R"([^\d\s]+\.)"), "ab."));
  EXPECT_FALSE(matches(grammar_from_regex(R"([^\d\s]+\.)"), "a1."));
  EXPECT_TRUE(matches(grammar_from_regex("a{2,}b"), "aaaab"));
  EXPECT_FALSE(matches(grammar_from_regex("a{2,}b"), "ab"));
  EXPECT_TRUE(matches(grammar_from_regex("(?:x|y)*?z"), "xyxz"));
}

TEST(Regex, Errors) {
  EXPECT_THROW(grammar_from_regex("(a"), GrammarError);
  EXPECT_THROW(grammar_from_regex("a)"), GrammarError);
  EXPECT_THROW(grammar_from_regex(R"((a)\1)"), GrammarError);
  EXPECT_THROW(grammar_from_regex("(?=a)a"), GrammarError);
  EXPECT_THROW(grammar_from_regex("*a"), GrammarError);
  EXPECT_THROW(grammar_from_regex("a{100000}"), GrammarError);
  try {
    grammar_from_regex("ab[cd");
    FAIL();
  } catch (const GrammarError& e) {
    EXPECT_EQ(e.position(), 5u);
  }
}

TEST(Regex, ExponentialPatternCompilesBounded) {
  auto t0 = std::chrono::steady_clock::now();
  Grammar g = grammar_from_regex("(a|aa|aaa)*(a|aa)*b");
  EXPECT_TRUE(matches(g, std::string(200, 'a') + "b"));
  EXPECT_FALSE(matches(g, std::string(200, 'a') + "c"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(JsonSchema, ObjectWithRequiredAndOptional) {
  auto g = grammar_from_json_schema_text(R"({"type":"object","properties":{
      "a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}},"required":["b"]})");
  EXPECT_TRUE(matches(g, R"({"b":"x"})"));
  EXPECT_TRUE(matches(g, R"({ "a" : -12 , "b":"x\n\u00e9", "c":true })"));
  EXPECT_TRUE(matches(g, R"({"b":"x","c":false})"));
  EXPECT_FALSE(matches(g, R"({"a":1})"));          // b required
  EXPECT_FALSE(matches(g, R"({"b":"x","d":1})"));  // no additional properties
  EXPECT_FALSE(matches(g, R"({"c":true,"b":"x"})"));  // declared order
  EXPECT_FALSE(matches(g, R"({"a":01,"b":"x"})"));
}

TEST(JsonSchema, DeeplyNestedSchemaTextIsAGrammarErrorNamingTheLimit) {
  // 100,000 nested arrays in the schema's text (a string field of a request, so the body's own
  // nesting check does not see it): refused before any DOM is built, as a GrammarError (a 400
  // on the server), never a stack overflow in the walks that follow.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  try {
    grammar_from_json_schema_text(deep);
    FAIL() << "a 100,000-level schema compiled";
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("nested deeper than"), std::string::npos) << e.what();
  }
}

// A number beyond a double in the schema text is a GrammarError like any invalid JSON, not
// nlohmann's out_of_range escaping the compiler (fuzz_structured; regression
// tests/fuzz/regressions/fuzz_structured/schema-number-overflow).
TEST(JsonSchema, NumberOverflowInSchemaTextIsAGrammarError) {
  EXPECT_THROW(grammar_from_json_schema_text(R"({"type":"integer","maximum":4e746})"), GrammarError);
  EXPECT_THROW(grammar_from_json_schema_text("4e746"), GrammarError);
}

TEST(JsonSchema, ArraysEnumsRefs) {
  auto g = grammar_from_json_schema_text(R"({
    "$defs": {"node": {"type":"object","properties":{"v":{"enum":["x",1,null]},
                        "kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"]}},
    "$ref": "#/$defs/node"})");
  EXPECT_TRUE(matches(g, R"({"v":"x"})"));
  EXPECT_TRUE(matches(g, R"({"v":1,"kids":[{"v":null},{"v":"x","kids":[]}]})"));
  EXPECT_FALSE(matches(g, R"({"v":2})"));
  EXPECT_FALSE(matches(g, R"({"v":1,"kids":[{"v":1},{"v":1},{"v":1}]})"));
}

TEST(JsonSchema, StringsAndIntegerBounds) {
  auto g = grammar_from_json_schema_text(R"({"type":"array","prefixItems":[
      {"type":"string","minLength":2,"maxLength":3},{"type":"integer","minimum":-5,"exclusiveMaximum":120},
      {"type":"string","format":"date"},{"type":"string","pattern":"^[A-Z]{2}\\d$"}]})");
  EXPECT_TRUE(matches(g, R"(["ab",-5,"2024-02-29","XY7"])"));
  EXPECT_TRUE(matches(g, R"(["abc",119,"2024-12-31","AA0"])"));
  EXPECT_FALSE(matches(g, R"(["a",0,"2024-02-29","XY7"])"));
  EXPECT_FALSE(matches(g, R"(["ab",120,"2024-02-29","XY7"])"));
  EXPECT_FALSE(matches(g, R"(["ab",-6,"2024-02-29","XY7"])"));
  EXPECT_FALSE(matches(g, R"(["ab",5,"2024-13-01","XY7"])"));
  EXPECT_FALSE(matches(g, R"(["ab",5,"2024-12-01","xy7"])"));
  for (int v = -5; v < 120; ++v)
    EXPECT_TRUE(matches(g, "[\"ab\"," + std::to_string(v) + ",\"2024-01-01\",\"AB1\"]")) << v;
}

TEST(JsonSchema, NullableTypeListsAllOfCompact) {
  JsonSchemaOptions compact;
  compact.any_whitespace = false;
  auto g = grammar_from_json_schema_text(R"({"allOf":[{"type":"object","properties":{"a":{"type":["number","null"]}},"required":["a"]},
      {"properties":{"b":{"type":"string","nullable":true}},"required":["b"]}]})", compact);
  EXPECT_TRUE(matches(g, R"({"a": 1.5e3, "b": null})"));
  EXPECT_TRUE(matches(g, R"({"a": null, "b": "s"})"));
  EXPECT_FALSE(matches(g, R"({"a":null,"b":"s"})"));  // compact separators are ", " and ": "
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  EXPECT_NE(schema_error(R"({"type":"object","patternProperties":{}})").find("'patternProperties'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"not":{}})").find("'not'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"number","multipleOf":2})").find("'multipleOf'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"array","uniqueItems":true})").find("'uniqueItems'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"if":{"type":"string"},"then":{}})").find("'if'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"string","format":"hostname"})").find("hostname"), std::string::npos);
  EXPECT_NE(schema_error(R"({"$ref":"#/$defs/missing"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"objec"})").find("objec"), std::string::npos);
  EXPECT_NE(schema_error("{\"type\": ").find("position"), std::string::npos);
  // Deep nesting is refused, not a stack overflow.
  std::string deep;
  for (int i = 0; i < 5000; ++i) deep += R"({"type":"array","items":)";
  deep += "{}";
  for (int i = 0; i < 5000; ++i) deep += "}";
  EXPECT_NE(schema_error(deep).find("deeper"), std::string::npos);
}

// pydantic v2: Literal["cat"] is {"const": "cat", "type": "string"}, a str Enum is
// {"enum": [...], "type": "string"}, a discriminated union is oneOf + "discriminator" (an
// OpenAPI annotation: it does not change the language).
TEST(JsonSchema, ConstAndEnumWithTypeAsPydanticWrites) {
  auto g = grammar_from_json_schema_text(R"({
    "$defs": {
      "Cat": {"type": "object", "title": "Cat", "required": ["pet_type", "meows"],
              "properties": {"pet_type": {"const": "cat", "title": "Pet Type", "type": "string"},
                             "meows": {"type": "integer"}}},
      "Dog": {"type": "object", "title": "Dog", "required": ["pet_type", "barks"],
              "properties": {"pet_type": {"const": "dog", "type": "string"},
                             "barks": {"type": "number", "minimum": 0, "maximum": 1}}}},
    "type": "object", "required": ["pet", "color"],
    "properties": {
      "pet": {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
              "discriminator": {"propertyName": "pet_type", "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}}},
      "color": {"enum": ["red", "green", 3], "type": "string"}}})");
  EXPECT_TRUE(matches(g, R"({"pet":{"pet_type":"cat","meows":3},"color":"red"})"));
  EXPECT_TRUE(matches(g, R"({"pet":{"pet_type":"dog","barks":0.25},"color":"green"})"));
  EXPECT_FALSE(matches(g, R"({"pet":{"pet_type":"dog","meows":3},"color":"red"})"));
  EXPECT_FALSE(matches(g, R"({"pet":{"pet_type":"dog","barks":1.5},"color":"red"})"));
  EXPECT_FALSE(matches(g, R"({"pet":{"pet_type":"cow","meows":3},"color":"red"})"));
  EXPECT_FALSE(matches(g, R"({"pet":{"pet_type":"cat","meows":3},"color":3})"));  // not a string
  EXPECT_EQ(schema_error(R"({"const": 2, "type": ["integer", "null"]})"), "no error");
  EXPECT_EQ(schema_error(R"({"const": 2.0, "type": "integer"})"), "no error");
  EXPECT_NE(schema_error(R"({"const": "cat", "type": "integer"})").find("'const' value \"cat\""), std::string::npos);
  EXPECT_NE(schema_error(R"({"enum": [1, 2], "type": "string"})").find("no 'enum' value"), std::string::npos);
  EXPECT_NE(schema_error(R"({"enum": ["a"], "type": "string", "minLength": 3})").find("no 'enum' value satisfies the keywords next to it ('type', 'minLength')"),
            std::string::npos);
  EXPECT_NE(schema_error(R"({"const": 7, "maximum": 5})").find("'const' value 7 does not satisfy"), std::string::npos);
  EXPECT_NE(schema_error(R"({"enum": ["a"], "not": {}})").find("'not'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"const": "a", "enum": ["a"]})").find("'enum' next to 'const'"), std::string::npos);
  // Other keywords next to enum / const filter the values exactly (the value's text is matched
  // with the schema minus enum).
  auto filtered = grammar_from_json_schema_text(R"({"type":"array","prefixItems":[
      {"type":"string","enum":["a","abcd","xyz"],"minLength":3,"maxLength":3},
      {"type":"integer","enum":[5,12,-3,7.0],"minimum":0,"maximum":10},
      {"type":"string","enum":["ab1","abc"],"pattern":"^[a-z]+$"},
      {"enum":[[1,2],[1],[1,2,3]],"type":"array","minItems":2,"maxItems":2}]})");
  EXPECT_TRUE(matches(filtered, R"(["xyz",5,"abc",[1,2]])"));
  EXPECT_FALSE(matches(filtered, R"(["xyz",7.0,"abc",[1,2]])"));  // 7.0 is not integer-spelled
  for (const char* gone : {R"(["abcd",5,"abc",[1,2]])", R"(["xyz",12,"abc",[1,2]])", R"(["xyz",-3,"abc",[1,2]])",
                           R"(["xyz",5,"ab1",[1,2]])", R"(["xyz",5,"abc",[1]])", R"(["xyz",5,"abc",[1,2,3]])"})
    EXPECT_FALSE(matches(filtered, gone)) << gone;
  EXPECT_NE(schema_error(R"({"const": "a", "type": "strin"})").find("strin"), std::string::npos);
  auto nullable = grammar_from_json_schema_text(R"({"enum": ["a", null], "type": "string", "nullable": true})");
  EXPECT_TRUE(matches(nullable, R"("a")"));
  EXPECT_TRUE(matches(nullable, "null"));
}

// minProperties / maxProperties count declared and additional members alike: every object of
// declared members (in order, any subset, "b" required when asked) followed by 0..3
// additional ones is accepted exactly when its member count is within the bounds.
TEST(JsonSchema, MinAndMaxPropertiesCountMembers) {
  struct Case { int minp, maxp; bool extra, b_required; };
  const std::vector<Case> cases = {{1, -1, true, false}, {2, -1, true, false}, {0, 2, true, false}, {2, 3, true, false},
                                   {1, 1, true, false},  {2, -1, false, false}, {0, 1, false, false}, {2, 2, true, true},
                                   {0, 0, true, false},  {3, 5, true, true}};
  for (const auto& c : cases) {
    std::string schema = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"},"c":{"type":"integer"}})";
    schema += c.extra ? R"(,"additionalProperties":{"type":"integer"})" : R"(,"additionalProperties":false)";
    if (c.b_required) schema += R"(,"required":["b"])";
    schema += ",\"minProperties\":" + std::to_string(c.minp);
    if (c.maxp >= 0) schema += ",\"maxProperties\":" + std::to_string(c.maxp);
    auto g = grammar_from_json_schema_text(schema + "}");
    for (int mask = 0; mask < 8; ++mask)
      for (int extras = 0; extras <= 3; ++extras) {
        std::vector<std::string> members;
        for (int k = 0; k < 3; ++k)
          if (mask >> k & 1) members.push_back(std::string("\"") + char('a' + k) + "\": 1");
        for (int x = 0; x < extras; ++x) members.push_back(std::string("\"") + char('x' + x) + "\": 2");
        std::string doc = "{";
        for (size_t i = 0; i < members.size(); ++i) doc += (i ? ", " : "") + members[i];
        doc += "}";
        int n = static_cast<int>(members.size());
        bool ok = n >= c.minp && (c.maxp < 0 || n <= c.maxp) && (c.extra || extras == 0) && (!c.b_required || (mask & 2));
        EXPECT_EQ(matches(g, doc), ok) << schema << " on " << doc;
      }
  }
  auto any = grammar_from_json_schema_text(R"({"minProperties":1,"maxProperties":2})");  // type object implied
  EXPECT_FALSE(matches(any, "{}"));
  EXPECT_TRUE(matches(any, R"({"k": [1, {"z": null}]})"));
  EXPECT_TRUE(matches(any, R"({"k": 1, "j": "s"})"));
  EXPECT_FALSE(matches(any, R"({"k": 1, "j": "s", "i": true})"));
  EXPECT_NE(schema_error(R"({"type":"object","minProperties":3,"maxProperties":2})").find("maxProperties < minProperties"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"object","properties":{"a":{}},"minProperties":2})").find("admit no object"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"object","properties":{"a":{}},"required":["a"],"maxProperties":0})").find("admit no object"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"object","minProperties":-1})").find("non-negative"), std::string::npos);
}

TEST(Choice, ExactStrings) {
  auto g = grammar_from_choices({"yes", "no", "yes please"});
  EXPECT_TRUE(matches(g, "yes"));
  EXPECT_TRUE(matches(g, "yes please"));
  EXPECT_FALSE(matches(g, "ye"));
  EXPECT_THROW(grammar_from_choices({}), GrammarError);
}
