// A Jinja template engine covering what Hugging Face chat templates use, with the
// semantics of jinja2's ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True, extensions=[loopcontrols]) plus transformers' globals
// (raise_exception, strftime_now) and its tojson filter. See src/tokenizer/README.md, "Chat templates".
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <string>

namespace moeserve::jinja {

struct Template;

// Bounds on one render, each failing with a message naming the limit (templates come from
// model repositories and requests can pass chat_template_kwargs and deep messages).
struct RenderLimits {
  int max_recursion_depth = 256;              // nested macro / caller() calls
  // For-loop iterations of the whole render: above what a body within the size limit can
  // drive (10^6 messages, a few passes), far below a nest of range() loops (10^10 and more).
  int64_t max_loop_iterations = 10'000'000;
  size_t max_output_bytes = size_t{64} << 20;  // the output, each buffer and each string/list built
  size_t max_stack_bytes = size_t{2} << 20;    // stack used by recursion (at most half the thread's)
};

class CompiledTemplate {
 public:
  // Throws moeserve::Error("line N: ...") on syntax errors.
  static CompiledTemplate compile(const std::string& source);
  // `context` is an object of template variables. Throws moeserve::Error("line N: ...")
  // on raise_exception() and runtime errors (undefined operations, type errors, ...).
  std::string render(const nlohmann::ordered_json& context, const RenderLimits& limits = {}) const;

 private:
  std::shared_ptr<const Template> tpl_;
};

}  // namespace moeserve::jinja
