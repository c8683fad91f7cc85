// The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) as the
// official `anthropic` SDK sends and reads it, on the shared chat pipeline.
//
// A request is translated into the equivalent chat-completions body (system -> system message,
// tool_result blocks -> `tool` messages, assistant thinking / text / tool_use blocks -> one
// assistant message with `reasoning_content`, `content`, `tool_calls`), which then goes through
// parse_chat_request and OpenAIService::run_generation like /v1/chat/completions: the same
// chat template, tokenizer, parsers, output processor, metrics and aborts. Only the wire format
// differs (AnthropicFormatter). Errors: {"type":"error","error":{"type","message"}} with
// Anthropic's status codes (queue full and draining: 529 overloaded_error).
#pragma once
#include <memory>
#include <string>

#include "server/http_server.h"
#include "server/json_text.h"

namespace moeserve::server {

class OpenAIService;

struct AnthropicTranslation {
  ojson chat_body;                 // a /v1/chat/completions request body
  bool stream = false;
  bool single_tool_call = false;  // tool_choice.disable_parallel_tool_use
};

// Validates an Anthropic Messages body and builds the chat body. `count_only`:
// /v1/messages/count_tokens (max_tokens not required). Throws ApiError 400.
AnthropicTranslation translate_anthropic_request(const ojson& body, bool count_only);

// A tool call's arguments text -> the `input` of its tool_use block: the JSON object it
// holds, or {} when it is not a JSON object or nests deeper than the JSON nesting limit.
ojson anthropic_tool_input(const std::string& arguments);

// {"type":"error","error":{"type": <by status>, "message": ...}}.
std::string anthropic_error_body(int status, const std::string& message);
// Anthropic's status for one of the pipeline's (429 queue full / 503 draining -> 529).
int anthropic_status(int status);

// Routes /v1/messages and /v1/messages/count_tokens (errors in Anthropic's shape).
void handle_anthropic(OpenAIService& svc, const std::string& path, const HttpRequest& http,
                      std::shared_ptr<ResponseSink> sink);

}  // namespace moeserve::server
