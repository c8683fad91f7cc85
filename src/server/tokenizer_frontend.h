// The Frontend of a model directory: tokenizer.json + the chat template, chosen as vLLM does:
// --chat-template (a file or the template text) > <dir>/chat_template.jinja >
// tokenizer_config.json's chat_template.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "server/frontend.h"

namespace moeserve {
class Tokenizer;
class ChatTemplate;
}  // namespace moeserve

namespace moeserve::server {

class TokenizerFrontend : public Frontend {
 public:
  // Throws moeserve::Error naming the file that is missing or malformed.
  TokenizerFrontend(const std::string& model_dir, const std::string& chat_template_override);
  ~TokenizerFrontend() override;
  std::vector<int32_t> encode(const std::string& text, bool add_special_tokens) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override;
  std::unique_ptr<IncrementalDecoder> incremental(bool skip_special_tokens) const override;
  std::string render_chat(const ChatRenderInputs& in) const override;
  int vocab_size() const override;
  std::vector<int32_t> eos_token_ids() const override;
  bool token_bytes(std::vector<std::string>& bytes, std::vector<bool>& special) const override;

 private:
  std::shared_ptr<const Tokenizer> tok_;
  std::unique_ptr<ChatTemplate> tpl_;        // general template
  std::unique_ptr<ChatTemplate> tool_tpl_;   // tokenizer_config's "tool_use" template, if any
  std::string bos_, eos_;
};

}  // namespace moeserve::server
