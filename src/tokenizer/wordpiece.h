// WordPiece (BERT family) and WordLevel models of tokenizer.json.
//   WordPiece: greedy longest-match-first over each word; pieces after the first carry
//   `continuing_subword_prefix` ("##"); a word with an unmatchable rest, or longer than
//   `max_input_chars_per_word` characters, becomes the single unk token (HF semantics).
//   WordLevel: the word's id, or unk.
#pragma once
#include "tokenizer/model.h"

namespace moeserve::tok {

class WordPiece final : public VocabModel {
 public:
  explicit WordPiece(const nlohmann::json& model);
  void tokenize(std::string_view word, std::vector<int32_t>& out) const override;

 private:
  int32_t unk_id() const;  // throws when the unk token is not in the vocab (HF: MissingUnkToken)
  std::string unk_token_, prefix_;
  size_t max_chars_ = 100;
  WordCache cache_;
};

class WordLevel final : public VocabModel {
 public:
  explicit WordLevel(const nlohmann::json& model);
  void tokenize(std::string_view word, std::vector<int32_t>& out) const override;

 private:
  std::string unk_token_;
};

}  // namespace moeserve::tok
