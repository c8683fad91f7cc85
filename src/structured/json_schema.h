// JSON Schema -> Grammar, with xgrammar's coverage and defaults (so masks can be compared
// with it): properties in declared order, `required`, `additionalProperties` (absent = false
// when `properties` is given, as xgrammar's strict mode), enum / const (values must also
// satisfy the keywords next to them, e.g. pydantic's {"const": "cat", "type": "string"}),
// anyOf / oneOf (as anyOf), allOf of object schemas (merged), type lists, items /
// prefixItems, min/maxItems, min/maxLength, pattern, format (date, time, date-time, uuid,
// email, uri, ipv4), integer and number minimum / maximum / exclusive bounds
// (json_numbers.h), multipleOf on integers, min/maxProperties, $ref into $defs / definitions
// / the root (recursive), OpenAPI `nullable`. Annotations (title, description, default,
// examples, discriminator, ...) are ignored; any other keyword throws GrammarError naming it
// (a 400), never silently dropped. Nesting deeper than `max_depth` is refused.
#pragma once
#include <nlohmann/json.hpp>

#include "structured/grammar.h"

namespace moeserve::structured {

struct JsonSchemaOptions {
  // true: any JSON whitespace between tokens (xgrammar's default). false: compact with
  // ", " and ": " separators (xgrammar's any_whitespace=False).
  bool any_whitespace = true;
  int max_depth = 64;
  // Numbers with at most 18 integer digits, 16 fraction digits and a 2-digit exponent (so
  // every number a reader parses is a finite double): for tool-call arguments, whose parser
  // falls back to a string for a number it cannot read.
  bool bounded_numbers = false;
};

Grammar grammar_from_json_schema(const nlohmann::ordered_json& schema, const JsonSchemaOptions& opts = {});
// Parses the schema text first (a JSON syntax error is a GrammarError with its position).
Grammar grammar_from_json_schema_text(std::string_view schema_text, const JsonSchemaOptions& opts = {});
// Any JSON value (response_format json_object: an object).
Grammar grammar_for_any_json_object(const JsonSchemaOptions& opts = {});

// Adds the schema's value rule to `g` (for tool-call parameters) and returns its id.
int32_t add_json_schema_rule(Grammar& g, const nlohmann::ordered_json& schema, const JsonSchemaOptions& opts,
                             const std::string& name);

}  // namespace moeserve::structured
