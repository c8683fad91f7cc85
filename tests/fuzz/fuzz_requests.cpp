// The JSON request validation of every route, as the server runs it before any work: the
// body parser (UTF-8, depth, 1e400), then the route's validator (for the agent APIs, the
// translation to a chat body and then the chat validator, as anthropic_api.cpp and
// responses_api.cpp do), then what follows validation: sampling parameters per choice, the
// structured-output constraint compiled (response_format, structured_outputs, guided_*,
// forced tool calls with the minimax_m2 or hermes tool-call grammar) over a small byte
// vocabulary, and for chat the MiniMax-M2.5 chat template over the validated messages and tools.
// Input: first byte = route (byte % routes) and tool parser ((byte / routes) % 2); the rest:
// the body.
//
// Invariant: every input is either accepted or refused with an ApiError 4xx (or a template /
// grammar moeserve::Error, which the routes answer with 400). Any other exception (nlohmann
// type_error, std::out_of_range, ...) would be a 500 and escapes: libFuzzer reports a crash.
//
// Adding a route: one more entry in kRoutes.
#include "fuzz_common.h"
#include "fuzz_vocab.h"
#include "core/error.h"
#include "server/anthropic_api.h"
#include "server/protocol.h"
#include "server/responses_api.h"
#include "server/structured_request.h"
#include "server/tokenize_request.h"
#include "structured/constraint.h"
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

const char* g_tool_parser = "minimax_m2";

void after_validation(const GenRequest& r) {
  for (int i = 0; i < std::min(r.n, 4); ++i) (void)make_sampling_params(r, SamplingDefaults{}, 7, 4096, i);
  // As OpenAIService::run_generation: the constraint is compiled before anything is submitted.
  static structured::GrammarCache& cache = *[] {
    auto* c = new structured::GrammarCache(2);  // never freed: lives as long as the process
    c->set_warmup(false);
    return c;
  }();
  StructuredContext sctx;
  sctx.vocab = fuzz::small_vocab();
  sctx.cache = &cache;
  sctx.tool_parser = g_tool_parser;
  if (auto c = make_structured_constraint(r, sctx)) {
    structured::Matcher m(c->grammar);
    std::vector<uint32_t> mask(static_cast<size_t>(m.mask_words()));
    m.fill_mask(mask);
  }
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
    [](const ojson& b) {                                                 // /v1/messages
      AnthropicTranslation tr = translate_anthropic_request(b, false);
      after_validation(parse_chat_request(tr.chat_body, kLimits));
    },
    [](const ojson& b) {  // /v1/messages/count_tokens
      AnthropicTranslation tr = translate_anthropic_request(b, true);
      after_validation(parse_chat_request(tr.chat_body, kLimits));
    },
    [](const ojson& b) {  // /v1/responses (previous_response_id: a stored two-message turn)
      ojson previous;
      if (b.is_object() && b.contains("previous_response_id") && b["previous_response_id"].is_string())
        previous = ojson::parse(R"([{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}])");
      ResponsesTranslation tr = translate_responses_request(b, previous);
      after_validation(parse_chat_request(tr.chat_body, kLimits));
    },
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in{data, size};
  const uint8_t sel = in.byte();
  const size_t route = sel % kRoutes.size();
  g_tool_parser = (sel / kRoutes.size()) % 2 ? "hermes" : "minimax_m2";
  const std::string body = in.rest();
  try {
    kRoutes[route](parse_json_body(body));
  } catch (const ApiError& e) {
    FUZZ_ASSERT(e.status >= 400 && e.status < 500, "a validator answered a non-4xx status");
  } catch (const Error&) {
    // Template errors, and a grammar whose parse state outgrew its limit (the server answers 400).
  }
  // Anything else (nlohmann type errors, std::out_of_range, ...) escapes: the server would
  // answer 500, so libFuzzer reports it as a crash (uncaught exception).
  return 0;
}
