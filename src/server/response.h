// Response bodies in vLLM's layout: SSE chunks (chat.completion.chunk / text_completion,
// unset fields omitted as pydantic's exclude_unset does) and non-streaming responses.
// Chunks are written by hand: they are the hot path of streaming.
#pragma once
#include <cstdint>
#include <string>

#include "server/frontend.h"
#include "server/output_processor.h"

namespace moeserve::server {

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

struct ResponseContext {
  std::string id;  // chatcmpl-<hex> / cmpl-<hex>
  int64_t created = 0;
  std::string model;
  bool chat = true;
  const Frontend* frontend = nullptr;  // for logprob token strings
  std::string chunk_prefix;            // cached `data: {"id":...,"choices":[`
  bool tokens_as_ids = false;          // return_tokens_as_token_ids: "token_id:<id>" strings
  void init_prefix();
};

// "data: <json>\n\n" framing.
inline void append_sse(std::string& out, const std::string& json) {
  out += "data: ";
  out += json;
  out += "\n\n";
}
constexpr const char* kSseDone = "data: [DONE]\n\n";

void append_usage(std::string& out, const Usage& u, bool with_details_null);

// Chat: the first chunk of a choice, {"role":"assistant","content":""}.
void append_chat_role_chunk(std::string& out, const ResponseContext& ctx, int index, const Usage* usage);
// One choice's delta (chat or completion by ctx.chat). `text_offset` is the completion
// logprobs' running character offset for that choice.
void append_delta_chunk(std::string& out, const ResponseContext& ctx, int index, const ChoiceDelta& d,
                        int64_t& text_offset, const Usage* usage);
// The final usage chunk ("choices":[]).
void append_usage_chunk(std::string& out, const ResponseContext& ctx, const Usage& u);
// An error frame after streaming started.
void append_error_chunk(std::string& out, int status, const std::string& type, const std::string& message);

// Non-streaming bodies from finished processors (one per choice, in index order). Chat:
// `echo_prefix[i]` (the echoed last message) is prepended to choice i's content.
std::string chat_response_json(const ResponseContext& ctx, const std::vector<const OutputProcessor*>& choices,
                               const Usage& u, const std::vector<std::string>& echo_prefix = {});
// Completions: `echo_prefix[i]` is prepended to choice i's text when echo is on.
std::string completion_response_json(const ResponseContext& ctx, const std::vector<const OutputProcessor*>& choices,
                                     const std::vector<std::string>& echo_prefix, const Usage& u);

std::string random_hex(int n);

}  // namespace moeserve::server
