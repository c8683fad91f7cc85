// /tokenize and /detokenize request bodies (vLLM's TokenizeCompletionRequest /
// TokenizeChatRequest / DetokenizeRequest), validated with request_fields.h before any work.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "server/protocol.h"

namespace moeserve::server {

struct TokenizeRequest {
  std::optional<std::string> model;
  bool return_token_strs = false;
  bool add_special_tokens = true;       // completion form default; chat form: false
  std::optional<std::string> prompt;    // completion form
  std::optional<GenRequest> chat;       // chat form (`messages` given)
};
TokenizeRequest parse_tokenize_request(const ojson& body, const ProtocolLimits& limits);

struct DetokenizeRequest {
  std::optional<std::string> model;
  std::vector<int32_t> tokens;
};
// `vocab` > 0: ids must be below it.
DetokenizeRequest parse_detokenize_request(const ojson& body, int vocab);

}  // namespace moeserve::server
