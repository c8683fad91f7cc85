#include "server/tokenize_request.h"

#include "server/request_fields.h"

namespace moeserve::server {

TokenizeRequest parse_tokenize_request(const ojson& body, const ProtocolLimits& limits) {
  if (!body.is_object()) type_error("body", "a valid dictionary", body);
  TokenizeRequest r;
  r.model = get_str(body, "model");
  r.return_token_strs = get_bool(body, "return_token_strs").value_or(false);
  if (field(body, "messages")) {
    r.chat = parse_chat_request(body, limits);
    r.add_special_tokens = get_bool(body, "add_special_tokens").value_or(false);
  } else {
    r.prompt = get_str(body, "prompt");
    if (!r.prompt) throw bad_request("Either `prompt` (a string) or `messages` is required", "prompt");
    r.add_special_tokens = get_bool(body, "add_special_tokens").value_or(true);
  }
  return r;
}

DetokenizeRequest parse_detokenize_request(const ojson& body, int vocab) {
  if (!body.is_object()) type_error("body", "a valid dictionary", body);
  DetokenizeRequest r;
  r.model = get_str(body, "model");
  auto tokens = get_token_ids(body, "tokens", vocab);
  if (!tokens) throw bad_request("1 validation error: body.tokens: Field required", "tokens");
  r.tokens = std::move(*tokens);
  return r;
}

}  // namespace moeserve::server
