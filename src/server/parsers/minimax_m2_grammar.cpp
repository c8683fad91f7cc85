// The grammar of MiniMax-M2's own tool-call syntax, for forced tool calls (tool_choice
// "required" or a named function). What it produces is exactly what MinimaxM2ToolParser reads:
//   [ \n]{0,8} <minimax:tool_call>\n
//   <invoke name="NAME">\n (<parameter name="P">VALUE</parameter>\n)* </invoke>\n   (1, or 1+ if parallel)
//   </minimax:tool_call>
// Parameters follow the tool's `properties` order; required ones must appear, optional ones
// may be skipped. VALUE is raw text for string parameters (what the parser keeps verbatim; it
// may not contain "</"), and JSON shaped by the parameter's schema otherwise (the parser
// json-loads those).
#include <fmt/format.h>

#include <set>

#include "server/parsers/parser.h"
#include "structured/json_schema.h"

namespace moeserve::server {

namespace {
using structured::Alt;
using structured::Grammar;
using structured::GrammarError;
using structured::Symbol;

bool is_plain_string_schema(const ojson& s) {
  return s.is_object() && s.contains("type") && s["type"] == "string" && !s.contains("enum") && !s.contains("pattern") &&
         !s.contains("format") && !s.contains("minLength") && !s.contains("maxLength") && !s.contains("const");
}

int32_t raw_text_rule(Grammar& g) {
  // ([^<] | "<"+ [^</p])* : text without "</" or "<p" (the parser ends a value at the first
  // "</parameter>", "</invoke>" or "</minimax:tool_call>", and "<parameter name=" would start
  // a new parameter), so what the grammar allows is exactly what the parser reads back.
  Alt not_lt, lts{Symbol::ref(g.plus(Alt{Symbol::byte('<')}, "lts"))};
  g.codepoints({{'<', '<'}}, true, not_lt);
  g.codepoints({{'<', '<'}, {'/', '/'}, {'p', 'p'}}, true, lts);
  int32_t unit = g.add_rule("raw_char", {not_lt, lts});
  return g.star(Alt{Symbol::ref(unit)}, "raw_text");
}

// minLength / maxLength as the JSON Schema compiler reads them: a non-negative integer up to
// 10000 (GrammarError otherwise, a 400), `dflt` when absent.
int length_field(const ojson& schema, const char* key, int dflt) {
  if (!schema.contains(key)) return dflt;
  const ojson& v = schema[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0) throw GrammarError(fmt::format("'{}' must be a non-negative integer", key));
  if (v.get<int64_t>() > 10000) throw GrammarError(fmt::format("'{}' above the supported limit of 10000", key));
  return static_cast<int>(v.get<int64_t>());
}

// A string parameter with constraints, as raw text: pattern / format through the regex
// compiler, lengths as counts of characters other than '<'.
int32_t raw_string_rule(Grammar& g, const ojson& schema) {
  if (schema.contains("pattern") || schema.contains("format")) {
    ojson s = schema;
    s.erase("minLength");
    s.erase("maxLength");
    // Compile `"PATTERN"` as a JSON string schema and drop the quotes: the regex rule is the
    // middle symbol of the string's only alternative.
    structured::JsonSchemaOptions o;
    int32_t r = structured::add_json_schema_rule(g, s, o, "raw_pattern");
    const Alt& a = g.rules[r].alts.at(0);
    if (a.size() != 3 || !a[1].is_rule()) throw GrammarError("unsupported string parameter schema");
    return a[1].rule;
  }
  int lo = length_field(schema, "minLength", 0), hi = length_field(schema, "maxLength", -1);
  if (hi >= 0 && hi < lo) throw GrammarError("maxLength < minLength: no string matches");
  Alt ch, out;
  g.codepoints({{'<', '<'}}, true, ch);
  g.repeat(ch, lo, hi, "raw_len", out);
  return g.add_rule("raw_string", {out});
}

int32_t value_rule(Grammar& g, const ojson& schema, const std::string& where, int32_t raw_text) {
  if (!schema.is_object() || schema.empty() || is_plain_string_schema(schema)) return raw_text;
  if (schema.contains("type") && schema["type"] == "string" && !schema.contains("enum") && !schema.contains("const")) {
    try {
      return raw_string_rule(g, schema);
    } catch (const GrammarError& e) {
      throw GrammarError(fmt::format("tool parameter {}: {}", where, e.what()));
    }
  }
  if (schema.contains("enum") && schema["enum"].is_array() && !schema["enum"].empty()) {
    bool all_strings = true;
    for (auto& v : schema["enum"]) all_strings = all_strings && v.is_string();
    if (all_strings) {  // raw text, one of the values
      std::vector<Alt> alts;
      for (auto& v : schema["enum"]) {
        Alt a;
        Grammar::literal(v.get<std::string>(), a);
        alts.push_back(std::move(a));
      }
      return g.add_rule("enum_value", std::move(alts));
    }
  }
  structured::JsonSchemaOptions o;
  o.any_whitespace = false;
  o.bounded_numbers = true;
  try {
    return structured::add_json_schema_rule(g, schema, o, "param");
  } catch (const GrammarError& e) {
    throw GrammarError(fmt::format("tool parameter {}: {}", where, e.what()));
  }
}
}  // namespace

Grammar minimax_m2_tool_call_grammar(const ToolCallGrammarRequest& req) {
  Grammar g;
  g.root = g.add_rule("root");
  int32_t raw = raw_text_rule(g);
  std::vector<Alt> invokes;
  for (const auto& [name, fn_ptr] : callable_tools(req)) {
    const ojson& fn = *fn_ptr;
    const ojson params = fn.value("parameters", ojson::object());
    ojson props = params.is_object() ? params.value("properties", ojson::object()) : ojson::object();
    std::set<std::string> required;
    if (params.is_object() && params.contains("required") && params["required"].is_array())
      for (auto& r : params["required"])
        if (r.is_string()) required.insert(r.get<std::string>());
    Alt inv;
    Grammar::literal("<invoke name=\"" + name + "\">\n", inv);
    if (props.is_object()) {
      for (auto& [pname, pschema] : props.items()) {
        Alt p;
        Grammar::literal("<parameter name=\"" + pname + "\">", p);
        p.push_back(Symbol::ref(value_rule(g, pschema, "'" + pname + "' of '" + name + "'", raw)));
        Grammar::literal("</parameter>\n", p);
        if (required.count(pname)) {
          inv.insert(inv.end(), p.begin(), p.end());
        } else {
          inv.push_back(Symbol::ref(g.optional(p, "opt_param")));
        }
      }
    }
    Grammar::literal("</invoke>\n", inv);
    invokes.push_back(std::move(inv));
  }
  if (invokes.empty()) throw GrammarError("no callable tool for the requested tool_choice");
  int32_t invoke = g.add_rule("invoke", std::move(invokes));
  Alt root;
  add_leading_whitespace(g, root);
  Grammar::literal("<minimax:tool_call>\n", root);
  if (req.parallel) root.push_back(Symbol::ref(g.plus(Alt{Symbol::ref(invoke)}, "invokes")));
  else root.push_back(Symbol::ref(invoke));
  Grammar::literal("</minimax:tool_call>", root);
  g.rules[g.root].alts = {root};
  g.check_no_left_recursion();
  return g;
}

}  // namespace moeserve::server
