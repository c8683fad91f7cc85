// Regular expression -> Grammar (vLLM's guided_regex / structured_outputs.regex, and JSON
// Schema `pattern`). The syntax is the common subset of Python `re` and ECMAScript that
// xgrammar accepts: literals and escapes, `.` (any character but newline), classes with
// ranges and negation, \d \w \s \D \W \S (ASCII, as xgrammar), groups `( )` `(?: )`
// `(?P<name> )` `(?<name> )`, `|`, quantifiers `* + ? {m} {m,} {m,n}` (lazy `?` suffix
// accepted: it does not change the language), `^` at the start and `$` at the end.
// Back-references, lookaround and anchors elsewhere are refused with the position.
#pragma once
#include <string_view>

#include "structured/grammar.h"

namespace moeserve::structured {

Grammar grammar_from_regex(std::string_view pattern, const GrammarLimits& limits = {});
// Adds the regex as a rule of `g` (for JSON Schema `pattern`) and returns the rule id.
int32_t add_regex_rule(Grammar& g, std::string_view pattern, const std::string& name);

}  // namespace moeserve::structured
