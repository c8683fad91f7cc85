// The BPE model of tokenizer.json (`model.type == "BPE"`): vocab, merges applied by rank
// (HF's priority-queue order: lowest rank first, leftmost on ties), ignore_merges,
// byte_fallback (<0xXX> tokens), unk_token with fuse_unk, continuing_subword_prefix and
// end_of_word_suffix. dropout is ignored (inference is deterministic). A word -> ids
// cache makes repeated words cheap.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/model.h"

namespace moeserve::tok {

class Bpe final : public VocabModel {
 public:
  explicit Bpe(const nlohmann::json& model);
  void tokenize(std::string_view word, std::vector<int32_t>& out) const override;

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  void merge_word(std::string_view w, std::vector<int32_t>& out) const;
  const Merge* find_merge(int32_t a, int32_t b) const;

  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<std::string> unk_token_;
  std::string prefix_, suffix_;
  bool has_prefix_ = false, has_suffix_ = false;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::vector<int32_t> byte_tokens_;  // <0xXX> ids (-1 when missing), for byte_fallback
  std::vector<int32_t> single_byte_;  // id of each 1-byte string, -1 when absent (fast path)
  WordCache cache_;
};

}  // namespace moeserve::tok
