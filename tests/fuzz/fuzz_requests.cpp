// The JSON request validation of every route, as the server runs it before any work: the
// body parser (UTF-8, depth, 1e400), then the route's validator, then what follows
// validation (sampling parameters per choice; for chat, the MiniMax-M2.5 chat template over
// the validated messages and tools). First byte: the route; the rest: the body.
//
// Adding a route: one more entry in kRoutes.
#include "fuzz_common.h"
#include "core/error.h"
#include "server/protocol.h"
#include "server/tokenize_request.h"
#include "tokenizer/chat_template.h"

#include <exception>
#include <fstream>
#include <functional>
#include <sstream>

using namespace moeserve;
using namespace moeserve::server;

namespace {
const ChatTemplate& chat_template() {
  static const ChatTemplate t = [] {
    std::ifstream f(MOESERVE_SOURCE_DIR "/tests/fixtures/shared-data/chat-templates/minimax-m2.5.jinja");
    std::stringstream ss;
    ss << f.rdbuf();
    return ChatTemplate::compile(ss.str());
  }();
  return t;
}

void after_validation(const GenRequest& r) {
  for (int i = 0; i < std::min(r.n, 4); ++i) (void)make_sampling_params(r, SamplingDefaults{}, 7, 4096, i);
  if (r.chat) {
    ChatTemplateInputs in;
    in.messages = r.messages;
    in.tools = r.tools;
    in.add_generation_prompt = r.add_generation_prompt;
    in.extra = r.chat_template_kwargs;
    (void)chat_template().render(in);
  }
}

const ProtocolLimits kLimits{20, true};
const std::vector<std::function<void(const ojson&)>> kRoutes = {
    [](const ojson& b) { after_validation(parse_chat_request(b, kLimits)); },        // /v1/chat/completions
    [](const ojson& b) { after_validation(parse_completion_request(b, kLimits)); },  // /v1/completions
    [](const ojson& b) {                                                             // /tokenize
      TokenizeRequest t = parse_tokenize_request(b, kLimits);
      if (t.chat) after_validation(*t.chat);
    },
    [](const ojson& b) { (void)parse_detokenize_request(b, 2048); },  // /detokenize
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in{data, size};
  const size_t route = in.byte() % kRoutes.size();
  const std::string body = in.rest();
  try {
    kRoutes[route](parse_json_body(body));
  } catch (const ApiError& e) {
    FUZZ_ASSERT(e.status >= 400 && e.status < 500, "a validator answered a non-4xx status");
  } catch (const Error&) {
    // Template errors (the server answers 400).
  }
  // Anything else (nlohmann type errors, std::out_of_range, ...) escapes: the server would
  // answer 500, so libFuzzer reports it as a crash (uncaught exception).
  return 0;
}
