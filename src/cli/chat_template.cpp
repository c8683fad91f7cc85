// `moeserve chat-template`: renders a conversation with a tokenizer's chat template and
// prints the prompt (nothing else, no trailing newline). Used by the Jinja oracle tests.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/registry.h"
#include "core/error.h"
#include "core/bounded_json.h"
#include "tokenizer/chat_template.h"

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MS_CHECK(f, "cannot open {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

nlohmann::ordered_json parse_json(const std::string& text, const std::string& what) {
  try {
    return moeserve::parse_json_bounded<nlohmann::ordered_json>(text, what);
  } catch (const nlohmann::json::exception& e) {
    moeserve::fail("{}: invalid JSON: {}", what, e.what());
  }
}

struct Options {
  std::string tokenizer, messages, tools, kwargs, chat_template;
  bool add_generation_prompt = false;
};

moeserve::cli::RegisterSubcommand reg(
    "chat-template", "Render a conversation with a chat template and print the prompt", [](CLI::App* sub) {
      auto o = std::make_shared<Options>();
      sub->add_option("--tokenizer", o->tokenizer, "Directory with tokenizer_config.json / chat_template.jinja");
      sub->add_option("--messages", o->messages, "JSON file: a list of messages (or an object with 'messages' and 'tools')")
          ->required();
      sub->add_option("--tools", o->tools, "JSON file: a list of tools");
      sub->add_flag("--add-generation-prompt", o->add_generation_prompt, "Append the assistant generation prompt");
      sub->add_option("--kwargs", o->kwargs, "JSON object of extra template variables (chat_template_kwargs)");
      sub->add_option("--chat-template", o->chat_template, "Template file to use instead of the tokenizer's");
      return [o]() -> int {
        using namespace moeserve;
        MS_CHECK(!o->tokenizer.empty() || !o->chat_template.empty(), "give --tokenizer or --chat-template");
        ChatTemplateInputs in;
        nlohmann::ordered_json msgs = parse_json(slurp(o->messages), o->messages);
        if (msgs.is_object()) {
          if (msgs.contains("tools")) in.tools = msgs["tools"];
          msgs = msgs.value("messages", nlohmann::ordered_json::array());
        }
        MS_CHECK(msgs.is_array(), "{}: messages must be a JSON list", o->messages);
        in.messages = msgs;
        if (!o->tools.empty()) in.tools = parse_json(slurp(o->tools), o->tools);
        in.add_generation_prompt = o->add_generation_prompt;
        if (!o->kwargs.empty()) {
          in.extra = parse_json(o->kwargs, "--kwargs");
          MS_CHECK(in.extra.is_object(), "--kwargs must be a JSON object");
        }
        std::string source;
        if (!o->tokenizer.empty()) {
          TokenizerConfig cfg = TokenizerConfig::load(o->tokenizer);
          in.bos_token = cfg.bos_token;
          in.eos_token = cfg.eos_token;
          if (o->chat_template.empty()) source = cfg.template_for(!in.tools.is_null());
        }
        if (!o->chat_template.empty()) source = slurp(o->chat_template);
        std::string out = ChatTemplate::compile(source).render(in);
        std::fwrite(out.data(), 1, out.size(), stdout);
        std::fflush(stdout);
        return 0;
      };
    });

}  // namespace
