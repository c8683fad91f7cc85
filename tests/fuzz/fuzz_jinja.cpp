// The Jinja lexer, parser and renderer: the input is a template, optionally followed by a
// NUL byte and a JSON object of template variables (else a chat-like default context).
#include "fuzz_common.h"
#include "core/bounded_json.h"
#include "tokenizer/jinja/jinja.h"

#include <exception>

using namespace moeserve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json kDefault = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi 日本"},
                 {"role": "assistant", "content": "", "reasoning_content": "think",
                  "tool_calls": [{"id": "c1", "type": "function",
                                  "function": {"name": "f", "arguments": {"x": 1, "y": [1.5, null, true]}}}]},
                 {"role": "tool", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
               "properties": {"x": {"type": "integer"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "n": -9223372036854775808,
    "big": 9223372036854775807, "f": 1.5e300, "d": {"1": 2}})");
  const std::string_view all = fuzz::as_text(data, size);
  const size_t nul = all.find('\0');
  const std::string source(all.substr(0, nul));
  nlohmann::ordered_json context = kDefault;
  if (nul != std::string_view::npos) {
    auto parsed = parse_json_bounded_or_discarded<nlohmann::ordered_json>(all.substr(nul + 1));
    if (parsed.is_object()) context = std::move(parsed);
  }
  jinja::RenderLimits limits;  // smaller than the defaults: keeps each execution fast
  limits.max_loop_iterations = 20000;
  limits.max_output_bytes = 1 << 20;
  try {
    auto tpl = jinja::CompiledTemplate::compile(source);
    (void)tpl.render(context, limits);
  } catch (const std::exception&) {
  }
  return 0;
}
