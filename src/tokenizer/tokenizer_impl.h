// Internal state of moeserve::Tokenizer (shared by tokenizer.cpp and incremental.cpp).
#pragma once
#include <string>
#include <unordered_set>
#include <vector>

#include "tokenizer/model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace moeserve {
namespace tok {
// tokenization_kimi.py's pieces: 400k-character chunks cut into runs of at most 25k whitespace
// or non-whitespace characters (Python str.isspace); views into `s` (tiktoken.cpp).
void tiktoken_pieces(std::string_view s, std::vector<std::string_view>& out);
}  // namespace tok

struct AddedToken {
  // decode / id_to_token return `content` as HF `tokenizers` 0.22 (the pinned oracle) does;
  // 0.23 returns the normalized content of a `normalized` added token instead.
  std::string content;
  std::string match;  // what is matched: content, normalized when `normalized` is set
  int32_t id = -1;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// Leftmost-longest literal matcher over the added tokens (HF uses Aho-Corasick with
// LeftmostLongest; added-token sets are small, so per-first-byte candidate lists do).
class AddedMatcher {
 public:
  void add(std::string pattern, size_t token_index);
  void finalize();
  bool empty() const { return count_ == 0; }
  // Appends (begin, end, token_index) of each match.
  struct Match {
    size_t b, e, tok;
  };
  void find(std::string_view s, std::vector<Match>& out) const;

 private:
  std::vector<std::vector<std::pair<std::string, size_t>>> by_first_{256};
  size_t count_ = 0;
};

struct Tokenizer::Impl {
  std::unique_ptr<tok::Normalizer> normalizer;
  std::unique_ptr<tok::PreTokenizer> pre;
  std::unique_ptr<tok::Model> model;
  std::unique_ptr<tok::PostProcessor> post;
  std::unique_ptr<tok::Decoder> decoder;
  std::vector<AddedToken> added;  // index = order of addition
  tok::StringIdMap added_by_content;
  std::unordered_map<int32_t, size_t> added_by_id;
  std::unordered_set<std::string> special_set;
  AddedMatcher raw_matcher, norm_matcher;
  int32_t max_id = -1;
  // tiktoken (Kimi): encode 400k-character pieces cut into runs of at most 25k whitespace or
  // non-whitespace characters separately, as tokenization_kimi.py does (tiktoken.cpp).
  bool tiktoken_pieces = false;

  // Token string of `id` (added first, then model), or nullptr.
  const std::string* token_of(int32_t id) const;
  bool is_special_token(const std::string& t) const { return special_set.count(t) != 0; }
  std::string decode_tokens(std::vector<std::string>& tokens) const;
};

}  // namespace moeserve
