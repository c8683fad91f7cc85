// Chat templates: renders a conversation into a prompt string with the model's Jinja
// chat template, exactly as transformers' apply_chat_template(tokenize=False) does.
#pragma once
#include <nlohmann/json.hpp>

#include <map>
#include <string>

#include "tokenizer/jinja/jinja.h"

namespace moeserve {

struct ChatTemplateInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null when absent
  bool add_generation_prompt = false;
  nlohmann::ordered_json extra;  // object: chat_template_kwargs such as enable_thinking
  std::string bos_token, eos_token;  // empty = not set (the variable is then undefined)
};

class ChatTemplate {
 public:
  // Throws moeserve::Error "line N: ..." on syntax errors.
  static ChatTemplate compile(const std::string& source);
  // Throws moeserve::Error on raise_exception / runtime errors (with line).
  std::string render(const ChatTemplateInputs& in) const;

 private:
  jinja::CompiledTemplate tpl_;
};

// tokenizer_config.json (+ chat_template.jinja next to it, which wins), bos/eos strings
// (plain or AddedToken objects).
struct TokenizerConfig {
  std::string chat_template;
  std::string bos_token, eos_token, pad_token, unk_token;
  bool add_bos_token = false, add_eos_token = false;
  // When chat_template is a list of {name, template}: all of them by name
  // (chat_template then holds "default", or the first one).
  std::map<std::string, std::string> named_templates;

  static TokenizerConfig load(const std::string& dir);
  // The template transformers would pick: "tool_use" when tools are given and it exists,
  // else "default"; a single template is always used. Throws when there is none.
  std::string template_for(bool has_tools) const;
};

}  // namespace moeserve
