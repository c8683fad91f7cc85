// Structured-output request fields -> a ConstraintSpec (parsing, in protocol), and a
// request's spec or forced tool choice -> the engine's StructuredConstraint (compiling, in
// the service). Accepted, as vLLM's OpenAI server:
//   response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {name, schema, strict}}
//   structured_outputs: {json, regex, choice, grammar, json_object, disable_any_whitespace}
//   guided_json, guided_regex, guided_choice, guided_grammar (the older spellings)
// Exactly one constraint per request; anything unsupported (structural_tag, whitespace
// patterns) is a 400 naming the field. Compile errors are a 400 with the reason and position.
#pragma once
#include <memory>

#include "server/json_text.h"
#include "server/protocol.h"
#include "structured/constraint.h"

namespace moeserve::server {

// Fills r.structured (and r.parallel_tool_calls). Throws ApiError 400.
void parse_structured_fields(const ojson& body, GenRequest& r);

struct StructuredContext {
  std::shared_ptr<const structured::TokenVocab> vocab;  // null: the model has no byte vocabulary
  structured::GrammarCache* cache = nullptr;
  std::string tool_parser;          // --tool-call-parser (forced tool calls need its grammar)
  std::vector<int32_t> start_after;  // reasoning-end token ids when a reasoning parser is on
};

// The engine constraint of `r` (null: unconstrained). Throws ApiError 400.
std::shared_ptr<const structured::StructuredConstraint> make_structured_constraint(const GenRequest& r,
                                                                                   const StructuredContext& ctx);

// The byte vocabulary of a tokenizer's tokens (byte-level BPE decoded; other tokens through
// `decode_one`), special tokens marked, `stop_ids` allowed at accept states.
std::shared_ptr<const structured::TokenVocab> make_token_vocab(std::vector<std::string> token_bytes,
                                                              std::vector<bool> special, std::vector<int32_t> stop_ids,
                                                              int32_t mask_size);

}  // namespace moeserve::server
