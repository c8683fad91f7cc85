#include "server/tokenizer_frontend.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "structured/matcher.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::server {

namespace fs = std::filesystem;

namespace {
std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  MS_CHECK(f.good(), "cannot read {}", p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class Detok : public IncrementalDecoder {
 public:
  Detok(std::shared_ptr<const Tokenizer> t, bool skip) : d_(std::move(t), skip) {}
  std::string push(int32_t id) override { return d_.push(id); }
  std::string finish() override { return d_.finish(); }

 private:
  IncrementalDetokenizer d_;
};
}  // namespace

TokenizerFrontend::TokenizerFrontend(const std::string& dir, const std::string& override_tpl) {
  tok_ = Tokenizer::from_dir(dir);
  TokenizerConfig tc;
  if (fs::exists(fs::path(dir) / "tokenizer_config.json")) tc = TokenizerConfig::load(dir);
  bos_ = tc.bos_token;
  eos_ = tc.eos_token;
  std::string src, tool_src;
  if (!override_tpl.empty()) {
    src = fs::exists(override_tpl) ? read_file(override_tpl) : override_tpl;
  } else if (fs::exists(fs::path(dir) / "chat_template.jinja")) {
    src = read_file(fs::path(dir) / "chat_template.jinja");
  } else {
    src = tc.template_for(false);
    tool_src = tc.template_for(true);
    if (tool_src == src) tool_src.clear();
  }
  if (!src.empty()) tpl_ = std::make_unique<ChatTemplate>(ChatTemplate::compile(src));
  if (!tool_src.empty()) tool_tpl_ = std::make_unique<ChatTemplate>(ChatTemplate::compile(tool_src));
}

TokenizerFrontend::~TokenizerFrontend() = default;

std::vector<int32_t> TokenizerFrontend::encode(const std::string& text, bool add_special) const {
  return tok_->encode(text, add_special);
}

std::string TokenizerFrontend::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  return tok_->decode(ids, skip_special);
}

std::unique_ptr<IncrementalDecoder> TokenizerFrontend::incremental(bool skip_special) const {
  return std::make_unique<Detok>(tok_, skip_special);
}

std::string TokenizerFrontend::render_chat(const ChatRenderInputs& in) const {
  const ChatTemplate* t = (in.tools.is_array() && tool_tpl_) ? tool_tpl_.get() : tpl_.get();
  MS_CHECK(t != nullptr,
           "As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat "
           "template if the tokenizer does not define one.");
  ChatTemplateInputs ci;
  ci.messages = in.messages;
  ci.tools = in.tools;
  ci.add_generation_prompt = in.add_generation_prompt;
  ci.extra = in.extra.is_object() ? in.extra : ojson::object();
  ci.bos_token = bos_;
  ci.eos_token = eos_;
  std::string out = t->render(ci);
  if (in.continue_final_message && !in.messages.empty()) {
    // Cut after the final message's content so the model continues it (vLLM).
    const ojson& last = in.messages.back();
    if (last.contains("content") && last["content"].is_string()) {
      const std::string& c = last["content"].get_ref<const std::string&>();
      size_t pos = out.rfind(c);
      if (!c.empty() && pos != std::string::npos) out.resize(pos + c.size());
    }
  }
  return out;
}

int TokenizerFrontend::vocab_size() const { return static_cast<int>(tok_->vocab_size()); }

bool TokenizerFrontend::token_bytes(std::vector<std::string>& bytes, std::vector<bool>& special) const {
  const size_t n = tok_->vocab_size();
  bytes.assign(n, std::string());
  special.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    if (tok_->is_special(id)) {
      special[i] = true;
      continue;
    }
    std::optional<std::string> t = tok_->id_to_token(id);
    if (!t) continue;  // a hole in the id space: never allowed
    // Byte-level BPE tokens spell bytes in GPT-2's alphabet; other tokens (added tokens
    // written as text, non-byte-level models) decode to their text.
    if (!structured::byte_level_decode(*t, bytes[i])) bytes[i] = tok_->decode({id}, false);
  }
  return true;
}

std::vector<int32_t> TokenizerFrontend::eos_token_ids() const {
  std::vector<int32_t> ids;
  if (!eos_.empty())
    if (auto id = tok_->token_to_id(eos_)) ids.push_back(*id);
  return ids;
}

}  // namespace moeserve::server
