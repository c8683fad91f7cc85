// The grammar of the Hermes tool-call syntax (Qwen3's), for forced tool calls (tool_choice
// "required" or a named function). What it produces is exactly what HermesToolParser reads:
//   [ \n]{0,8} <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
//   ("\n" <tool_call>...</tool_call>)*      (only with parallel_tool_calls)
// ARGS is JSON shaped by the tool's `parameters` schema (an object when it declares none), in
// the ", " / ": " layout of the chat template's `tojson` (what the model saw in its prompts).
#include <fmt/format.h>

#include <algorithm>

#include "server/parsers/parser.h"
#include "structured/json_schema.h"

namespace moeserve::server {

namespace {
using structured::Alt;
using structured::Grammar;
using structured::GrammarError;
using structured::Symbol;
}  // namespace

Grammar hermes_tool_call_grammar(const ToolCallGrammarRequest& req) {
  Grammar g;
  g.root = g.add_rule("root");
  std::vector<Alt> calls;
  for (const auto& [name, fn_ptr] : callable_tools(req)) {
    const ojson& fn = *fn_ptr;
    ojson params = fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"] : ojson::object();
    // No schema (or an empty one): any object, as the template's `{"arguments": <args-json-object>}` asks.
    if (params.empty()) params = ojson{{"type", "object"}};
    structured::JsonSchemaOptions o;
    o.any_whitespace = false;  // ", " and ": " separators
    o.bounded_numbers = true;  // a random model could otherwise loop on digits
    int32_t args;
    try {
      args = structured::add_json_schema_rule(g, params, o, "args");
    } catch (const GrammarError& e) {
      throw GrammarError(fmt::format("parameters of tool '{}': {}", name, e.what()));
    }
    Alt call;
    Grammar::literal("<tool_call>\n{\"name\": " + json_string(name) + ", \"arguments\": ", call);
    call.push_back(Symbol::ref(args));
    Grammar::literal("}\n</tool_call>", call);
    calls.push_back(std::move(call));
  }
  if (calls.empty()) throw GrammarError("no callable tool for the requested tool_choice");
  int32_t call = g.add_rule("call", std::move(calls));
  Alt root;
  add_leading_whitespace(g, root);
  root.push_back(Symbol::ref(call));
  if (req.parallel) {
    Alt more;
    Grammar::literal("\n", more);
    more.push_back(Symbol::ref(call));
    root.push_back(Symbol::ref(g.star(more, "more_calls")));
  }
  g.rules[g.root].alts = {root};
  g.check_no_left_recursion();
  return g;
}

}  // namespace moeserve::server
