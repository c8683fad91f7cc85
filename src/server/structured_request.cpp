#include "server/structured_request.h"

#include <fmt/format.h>

#include "core/bounded_json.h"
#include "server/errors.h"
#include "server/parsers/parser.h"

namespace moeserve::server {

using structured::ConstraintKind;
using structured::ConstraintSpec;

namespace {

const ojson* non_null(const ojson& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string schema_text(const ojson& v, const std::string& field) {
  if (v.is_object() || v.is_boolean()) return v.dump();
  if (v.is_string()) {
    // A second document from outside: the body's nesting limit applies to it too (dump()
    // and the schema compiler recurse once per level; 200,000 levels overflowed the stack).
    ojson parsed;
    try {
      parsed = parse_json_bounded<ojson>(v.get<std::string>(), field);
    } catch (const JsonDepthError& e) {
      throw bad_request(e.what(), field);
    } catch (const ojson::exception&) {
      throw bad_request(fmt::format("{}: the JSON schema string is not valid JSON", field), field);
    }
    return parsed.dump();
  }
  throw bad_request(fmt::format("{} must be a JSON schema (an object)", field), field);
}

std::string string_field(const ojson& v, const std::string& field) {
  if (!v.is_string()) throw bad_request(fmt::format("{} must be a string", field), field);
  return v.get<std::string>();
}

std::vector<std::string> choices_field(const ojson& v, const std::string& field) {
  if (!v.is_array() || v.empty()) throw bad_request(fmt::format("{} must be a non-empty list of strings", field), field);
  std::vector<std::string> out;
  for (auto& c : v) {
    if (!c.is_string()) throw bad_request(fmt::format("{} must be a non-empty list of strings", field), field);
    out.push_back(c.get<std::string>());
  }
  return out;
}

void set_once(GenRequest& r, ConstraintSpec spec) {
  if (r.structured)
    throw bad_request(fmt::format("Only one kind of structured outputs constraint is allowed per request, got "
                                  "'{}' and '{}'",
                                  r.structured->origin, spec.origin),
                      spec.origin);
  r.structured = std::move(spec);
}

}  // namespace

void parse_structured_fields(const ojson& body, GenRequest& r) {
  if (const ojson* ptc = non_null(body, "parallel_tool_calls")) {
    if (!ptc->is_boolean()) throw bad_request("parallel_tool_calls must be a boolean", "parallel_tool_calls");
    r.parallel_tool_calls = ptc->get<bool>();
  }
  bool any_ws = true;
  if (const ojson* so = non_null(body, "structured_outputs")) {
    if (!so->is_object()) throw bad_request("structured_outputs must be an object", "structured_outputs");
    if (const ojson* d = non_null(*so, "disable_any_whitespace")) {
      if (!d->is_boolean()) throw bad_request("structured_outputs.disable_any_whitespace must be a boolean", "structured_outputs");
      any_ws = !d->get<bool>();
    }
    for (auto& [k, v] : so->items()) {
      if (v.is_null()) continue;
      const std::string f = "structured_outputs." + k;
      ConstraintSpec s;
      s.origin = f;
      s.any_whitespace = any_ws;
      if (k == "json") { s.kind = ConstraintKind::JsonSchema; s.text = schema_text(v, f); }
      else if (k == "regex") { s.kind = ConstraintKind::Regex; s.text = string_field(v, f); }
      else if (k == "choice") { s.kind = ConstraintKind::Choice; s.choices = choices_field(v, f); }
      else if (k == "grammar") { s.kind = ConstraintKind::Grammar; s.text = string_field(v, f); }
      else if (k == "json_object") {
        if (!v.is_boolean()) throw bad_request(f + " must be a boolean", f);
        if (!v.get<bool>()) continue;
        s.kind = ConstraintKind::JsonObject;
      } else if (k == "disable_any_whitespace" || k == "disable_fallback" || k == "disable_additional_properties") {
        if (k == "disable_additional_properties" && v.is_boolean() && !v.get<bool>())
          throw bad_request(f + ": false is not supported (additional properties are disallowed unless the schema allows them)", f);
        continue;  // disable_fallback: there is no other backend to fall back to
      } else {
        throw bad_request(fmt::format("{} is not supported", f), f);
      }
      set_once(r, std::move(s));
    }
  }
  struct Old { const char* key; ConstraintKind kind; };
  for (Old o : {Old{"guided_json", ConstraintKind::JsonSchema}, Old{"guided_regex", ConstraintKind::Regex},
                Old{"guided_choice", ConstraintKind::Choice}, Old{"guided_grammar", ConstraintKind::Grammar}}) {
    const ojson* v = non_null(body, o.key);
    if (!v) continue;
    ConstraintSpec s;
    s.kind = o.kind;
    s.origin = o.key;
    s.any_whitespace = any_ws;
    if (o.kind == ConstraintKind::JsonSchema) s.text = schema_text(*v, o.key);
    else if (o.kind == ConstraintKind::Choice) s.choices = choices_field(*v, o.key);
    else s.text = string_field(*v, o.key);
    set_once(r, std::move(s));
  }
  for (const char* k : {"guided_whitespace_pattern", "structural_tag"})
    if (non_null(body, k)) throw bad_request(fmt::format("{} is not supported", k), k);
  if (const ojson* rf = non_null(body, "response_format")) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      throw bad_request("response_format must be an object with a string 'type'", "response_format");
    const std::string type = (*rf)["type"].get<std::string>();
    ConstraintSpec s;
    s.origin = "response_format";
    s.any_whitespace = any_ws;
    if (type == "text") return;
    if (type == "json_object") {
      s.kind = ConstraintKind::JsonObject;
    } else if (type == "json_schema") {
      const ojson* js = non_null(*rf, "json_schema");
      if (!js || !js->is_object()) throw bad_request("response_format.json_schema must be an object", "response_format");
      const ojson* schema = non_null(*js, "schema");
      if (!schema) schema = non_null(*js, "json_schema");  // some clients nest it under this name
      if (!schema) throw bad_request("response_format.json_schema.schema is required", "response_format");
      s.kind = ConstraintKind::JsonSchema;
      s.text = schema_text(*schema, "response_format.json_schema.schema");
      // The output always follows the schema exactly. `strict: true` also makes it compact
      // (", " and ": " separators, no other whitespace), so a strict schema with bounded
      // strings has a bounded output length.
      if (const ojson* st = non_null(*js, "strict")) {
        if (!st->is_boolean()) throw bad_request("response_format.json_schema.strict must be a boolean", "response_format");
        if (st->get<bool>()) s.any_whitespace = false;
      }
    } else {
      throw bad_request(fmt::format("response_format type '{}' is not supported (text, json_object, json_schema)", type),
                        "response_format");
    }
    set_once(r, std::move(s));
  }
}

std::shared_ptr<const structured::StructuredConstraint> make_structured_constraint(const GenRequest& r,
                                                                                   const StructuredContext& ctx) {
  const bool forced_tools = r.chat && (r.tool_choice == ToolChoice::Required || r.tool_choice == ToolChoice::Named);
  if (!r.structured && !forced_tools) return nullptr;
  if (r.structured && forced_tools)
    throw bad_request(fmt::format("{} cannot be combined with tool_choice \"required\" or a named tool",
                                  r.structured->origin),
                      r.structured->origin);
  if (!ctx.vocab || !ctx.cache)
    throw bad_request("structured outputs are not available: the model's tokenizer has no byte-level vocabulary");
  auto c = std::make_shared<structured::StructuredConstraint>();
  c->start_after_tokens = ctx.start_after;
  try {
    if (r.structured) {
      c->grammar = ctx.cache->get(*r.structured, ctx.vocab);
    } else {
      if (ctx.tool_parser.empty() || !has_tool_call_grammar(ctx.tool_parser))
        throw bad_request(fmt::format("tool_choice \"{}\" needs --tool-call-parser with a tool-call grammar{}",
                                      r.tool_choice == ToolChoice::Named ? r.named_tool : "required",
                                      ctx.tool_parser.empty() ? "" : " ('" + ctx.tool_parser + "' has none)"),
                          "tool_choice");
      ToolCallGrammarRequest tr{r.tools, {}, r.parallel_tool_calls};
      if (r.tool_choice == ToolChoice::Named) tr.names = {r.named_tool};
      ConstraintSpec spec;
      spec.kind = ConstraintKind::ToolCalls;
      spec.origin = "tool_choice";
      spec.text = ctx.tool_parser + "\n" + r.tools.dump() + "\n" + (tr.names.empty() ? "" : tr.names[0]) +
                  (tr.parallel ? "\nparallel" : "\nsingle");
      c->grammar = ctx.cache->get(spec, ctx.vocab, [&] { return tool_call_grammar(ctx.tool_parser, tr); });
    }
  } catch (const structured::GrammarError& e) {
    const std::string origin = r.structured ? r.structured->origin : std::string("tools");
    throw bad_request(fmt::format("Invalid {}: {}", origin, e.what()), origin);
  }
  return c;
}

std::shared_ptr<const structured::TokenVocab> make_token_vocab(std::vector<std::string> token_bytes,
                                                              std::vector<bool> special, std::vector<int32_t> stop_ids,
                                                              int32_t mask_size) {
  auto v = std::make_shared<structured::TokenVocab>();
  v->token_bytes = std::move(token_bytes);
  v->special = std::move(special);
  v->stop_ids = std::move(stop_ids);
  v->mask_size = mask_size;
  v->build();
  return v;
}

}  // namespace moeserve::server
