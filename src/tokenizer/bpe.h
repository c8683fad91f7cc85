// The BPE model of tokenizer.json (`model.type == "BPE"`): vocab, merges applied by rank
// (HF's priority-queue order: lowest rank first, leftmost on ties), ignore_merges,
// byte_fallback (<0xXX> tokens), unk_token with fuse_unk, continuing_subword_prefix and
// end_of_word_suffix. dropout is ignored (inference is deterministic). A word -> ids
// cache makes repeated words cheap.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace moeserve::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Bpe {
 public:
  explicit Bpe(const nlohmann::json& model);
  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;
  std::optional<int32_t> token_to_id(std::string_view t) const;
  const std::string* id_to_token(int32_t id) const;
  size_t vocab_entries() const { return vocab_.size(); }  // HF BPE::get_vocab_size
  int32_t max_id() const { return max_id_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  void merge_word(std::string_view w, std::vector<int32_t>& out) const;
  const Merge* find_merge(int32_t a, int32_t b) const;

  StringIdMap vocab_;
  std::vector<const std::string*> id_to_token_;
  int32_t max_id_ = -1;
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<std::string> unk_token_;
  std::string prefix_, suffix_;
  bool has_prefix_ = false, has_suffix_ = false;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::vector<int32_t> byte_tokens_;  // <0xXX> ids (-1 when missing), for byte_fallback
  std::vector<int32_t> single_byte_;  // id of each 1-byte string, -1 when absent (fast path)

  // Word cache, sharded to keep concurrent encodes from serialising on one lock.
  static constexpr size_t kShards = 16;
  static constexpr size_t kMaxPerShard = 16384;
  static constexpr size_t kMaxWordLen = 256;
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  mutable std::unique_ptr<Shard[]> cache_;
};

}  // namespace moeserve::tok
