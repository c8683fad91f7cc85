#include "tokenizer/wordpiece.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace moeserve::tok {

namespace {
std::string str_field(const nlohmann::json& m, const char* key, const char* dflt) {
  if (!m.contains(key) || m[key].is_null()) return dflt;
  MS_CHECK(m[key].is_string(), "model.{} must be a string, got {}", key, m[key].dump());
  return m[key].get<std::string>();
}
}  // namespace

WordPiece::WordPiece(const nlohmann::json& m) {
  MS_CHECK(m.contains("vocab"), "WordPiece model has no 'vocab'");
  vocab_.load(m["vocab"], "WordPiece");
  unk_token_ = str_field(m, "unk_token", "[UNK]");
  prefix_ = str_field(m, "continuing_subword_prefix", "##");
  if (m.contains("max_input_chars_per_word") && !m["max_input_chars_per_word"].is_null()) {
    MS_CHECK(m["max_input_chars_per_word"].is_number_unsigned(), "model.max_input_chars_per_word must be a non-negative integer");
    max_chars_ = m["max_input_chars_per_word"].get<size_t>();
  }
}

int32_t WordPiece::unk_id() const {
  auto id = vocab_.find(unk_token_);
  MS_CHECK(id.has_value(), "WordPiece: unknown word and the unk token '{}' is missing from the vocabulary", unk_token_);
  return *id;
}

void WordPiece::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  bool cacheable = word.size() <= WordCache::kMaxWordLen;
  if (cacheable && cache_.get(word, out)) return;
  size_t chars = 0;
  for (unsigned char c : word) chars += (c & 0xC0) != 0x80;
  std::vector<int32_t> ids;
  if (chars > max_chars_) {
    ids.push_back(unk_id());
  } else {
    // Greedy: the longest vocab entry starting at `start` (with the prefix after the first
    // piece), shrinking one character at a time.
    std::string buf;
    size_t start = 0;
    while (start < word.size()) {
      size_t end = word.size();
      int32_t found = -1;
      while (start < end) {
        buf.clear();
        if (start > 0) buf += prefix_;
        buf.append(word.substr(start, end - start));
        if (auto id = vocab_.find(buf)) {
          found = *id;
          break;
        }
        size_t k = end;
        prev_cp(word, k);
        end = k;
      }
      if (found < 0) {
        ids.assign(1, unk_id());
        break;
      }
      ids.push_back(found);
      start = end;
    }
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) cache_.put(word, ids.data(), ids.size());
}

WordLevel::WordLevel(const nlohmann::json& m) {
  MS_CHECK(m.contains("vocab"), "WordLevel model has no 'vocab'");
  vocab_.load(m["vocab"], "WordLevel");
  unk_token_ = str_field(m, "unk_token", "<unk>");
}

void WordLevel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (auto id = vocab_.find(word)) {
    out.push_back(*id);
    return;
  }
  auto unk = vocab_.find(unk_token_);
  MS_CHECK(unk.has_value(), "WordLevel: unknown word and the unk token '{}' is missing from the vocabulary", unk_token_);
  out.push_back(*unk);
}

}  // namespace moeserve::tok
