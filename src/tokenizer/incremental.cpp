// Incremental detokenizer. Text for ids [0, n) is produced as
//   decode(ids[prefix, n)) minus decode(ids[prefix, read)),
// i.e. each window keeps one already-emitted token as context, so decoder rules that
// look at the first token (Metaspace / Strip dropping a leading space) cancel out.
// Text is held back while it ends in U+FFFD (an incomplete UTF-8 tail) or, for
// ByteFallback decoders, while the last token is a <0xXX> byte token (HF validates a
// whole run of byte tokens at once, so a later byte could still change the run's text).
// Special (when skipped) and unknown ids are dropped on entry, as decode() drops them.
#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace moeserve {

IncrementalDetokenizer::IncrementalDetokenizer(std::shared_ptr<const Tokenizer> tok, bool skip_special_tokens)
    : tok_(std::move(tok)), skip_special_(skip_special_tokens) {
  MS_CHECK(tok_ != nullptr, "IncrementalDetokenizer needs a tokenizer");
}

std::string IncrementalDetokenizer::decode_range(size_t b, size_t e) const {
  const auto& im = *tok_->impl_;
  std::vector<std::string> tokens;
  tokens.reserve(e - b);
  for (size_t k = b; k < e; ++k) tokens.push_back(*im.token_of(ids_[k]));
  return im.decode_tokens(tokens);
}

namespace {
bool is_byte_token(const std::string& t) {
  return t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>';
}
}  // namespace

std::string IncrementalDetokenizer::push(int32_t id) {
  const auto& im = *tok_->impl_;
  const std::string* t = im.token_of(id);
  if (!t) return {};
  if (skip_special_ && im.is_special_token(*t)) return {};
  ids_.push_back(id);
  if (im.decoder && im.decoder->groups_byte_tokens() && is_byte_token(*t)) return {};
  std::string text = decode_range(prefix_, ids_.size());
  if (text.size() <= prefix_text_.size() || tok::ends_with_replacement(text) ||
      text.compare(0, prefix_text_.size(), prefix_text_) != 0)
    return {};
  std::string delta = text.substr(prefix_text_.size());
  prefix_ = read_;
  read_ = ids_.size();
  prefix_text_ = decode_range(prefix_, read_);
  // Drop ids before the window so memory stays bounded on long streams.
  if (prefix_ > 64) {
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_));
    read_ -= prefix_;
    prefix_ = 0;
  }
  return delta;
}

std::string IncrementalDetokenizer::finish() {
  std::string text = decode_range(prefix_, ids_.size());
  std::string delta;
  if (text.size() > prefix_text_.size() && text.compare(0, prefix_text_.size(), prefix_text_) == 0)
    delta = text.substr(prefix_text_.size());
  prefix_ = read_ = 0;
  prefix_text_.clear();
  ids_.clear();
  return delta;
}

}  // namespace moeserve
