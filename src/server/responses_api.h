// The OpenAI Responses API (`POST /v1/responses`, `GET|DELETE /v1/responses/{id}`,
// `POST /v1/responses/{id}/cancel`) as the official `openai` SDK's `client.responses` uses it,
// on the shared chat pipeline.
//
// A request becomes the equivalent chat-completions body: `instructions` -> system message,
// the stored conversation of `previous_response_id`, then the input items (messages;
// reasoning + assistant message + function_call items of one turn -> one assistant message with
// `reasoning_content`, `content`, `tool_calls`; function_call_output -> `tool` messages). It
// goes through parse_chat_request and OpenAIService::run_generation like /v1/chat/completions;
// ResponsesFormatter writes the Response object and the stream events from the shared
// BlockAssembler (agent_output.h). Errors keep the OpenAI shape of the other /v1 routes.
#pragma once
#include <memory>
#include <string>

#include "server/http_server.h"
#include "server/json_text.h"
#include "server/responses_store.h"

namespace moeserve::server {

class OpenAIService;

struct ResponsesTranslation {
  ojson chat_body;          // a /v1/chat/completions body
  ojson response_fields;    // the request echo of the Response object (instructions, tools, ...)
  ojson history;            // input messages without instructions (what a follow-up continues)
  bool stream = false;
  bool store = true;
  int max_tool_calls = -1;  // parallel_tool_calls=false: 1; -1: unlimited
  bool include_encrypted_reasoning = false;
};

// Input items -> chat messages (appended to `out`). Throws ApiError 400.
void responses_items_to_messages(const ojson& items, ojson& out);

// `previous`: the stored conversation of previous_response_id (null when none).
ResponsesTranslation translate_responses_request(const ojson& body, const ojson& previous);

class ResponsesApi {
 public:
  explicit ResponsesApi(ResponseStoreLimits limits = {}) : store_(limits) {}
  // `path` starts with /v1/responses.
  void handle(OpenAIService& svc, const std::string& path, const HttpRequest& http, std::shared_ptr<ResponseSink> sink);
  ResponseStore& store() { return store_; }

 private:
  void create(OpenAIService& svc, const HttpRequest& http, std::shared_ptr<ResponseSink> sink);
  ResponseStore store_;
};

}  // namespace moeserve::server
