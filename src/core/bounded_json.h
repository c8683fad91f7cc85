// Parsing JSON from outside (HTTP bodies, config.json, tokenizer files, safetensors headers,
// index files, chat-template inputs, hub answers) with a nesting limit.
//
// nlohmann's parser is iterative, but copying, comparing, dumping and every walk over the
// parsed DOM recurse once per level, so a body nested 100,000 levels deep overflows the
// stack later. Every document from outside goes through parse_json_bounded(), which counts
// the nesting of the text first (a linear scan that keeps no state beyond a counter and the
// in-string flag) and refuses documents deeper than the limit before any DOM is built. With
// depth <= limit every later recursive walk uses at most `limit` frames.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "core/error.h"

namespace moeserve {

constexpr int kDefaultJsonDepthLimit = 512;
// The most the limit may be raised to: a DOM this deep still fits the recursive walks of
// nlohmann (copy, dump, ==) and of the Jinja values (kMaxValueDepth) on an 8 MiB stack.
constexpr int kMaxJsonDepthLimit = 2048;

// The process-wide limit (serve --max-json-depth sets it once at start-up).
int json_depth_limit();
void set_json_depth_limit(int levels);

// A document nested deeper than the limit. `what` names the document.
class JsonDepthError : public Error {
 public:
  JsonDepthError(std::string_view what, int limit);
  int limit;
};

// The deepest nesting of arrays/objects in `text`, counting brackets outside strings (the
// nesting of the DOM nlohmann would build). Stops counting once `stop_above` is exceeded.
int json_nesting_depth(std::string_view text, int stop_above);

// Throws JsonDepthError when `text` nests deeper than `limit`; else Json::parse(text), whose
// own errors (nlohmann::json::parse_error, out_of_range for 1e400) pass through unchanged.
template <typename Json = nlohmann::json>
Json parse_json_bounded(std::string_view text, std::string_view what, int limit = json_depth_limit()) {
  if (json_nesting_depth(text, limit) > limit) throw JsonDepthError(what, limit);
  return Json::parse(text);
}

// As parse_json_bounded, but a syntax error, a number overflow or excess depth gives a
// discarded value (Json::is_discarded()) instead of throwing.
template <typename Json = nlohmann::json>
Json parse_json_bounded_or_discarded(std::string_view text, int limit = json_depth_limit()) {
  if (json_nesting_depth(text, limit) > limit) return Json(Json::value_t::discarded);
  return Json::parse(text, nullptr, /*allow_exceptions=*/false);
}

// The depth of an already-built DOM, without recursion (documents built in code, e.g. from
// a template or a YAML-like source, before they are walked recursively).
int json_value_depth(const nlohmann::json& j, int stop_above);
int json_value_depth(const nlohmann::ordered_json& j, int stop_above);

}  // namespace moeserve
