// Unigram model of tokenizer.json (sentencepiece-converted tokenizers: T5, XLM-R, ...):
// vocab = [[piece, score], ...] (id = index), unk_id, byte_fallback. A word is segmented by
// Viterbi over the lattice of vocab pieces (best total score; a character with no
// single-character piece gets an unk node scored min_score - 10); consecutive unk pieces
// are fused, and an unknown piece becomes <0xXX> byte tokens with byte_fallback. This is
// HF's `encode_optimized`, tie-breaking included (earlier start, then shorter piece wins).
#pragma once
#include <unordered_map>

#include "tokenizer/model.h"

namespace moeserve::tok {

class Unigram final : public Model {
 public:
  explicit Unigram(const nlohmann::json& model);
  void tokenize(std::string_view word, std::vector<int32_t>& out) const override;
  std::optional<int32_t> token_to_id(std::string_view t) const override;
  const std::string* id_to_token(int32_t id) const override;
  size_t vocab_entries() const override { return pieces_.size(); }
  int32_t max_id() const override { return static_cast<int32_t>(pieces_.size()) - 1; }

 private:
  // Byte trie over the pieces: child of (node, byte), and the piece id ending at a node.
  int32_t child(int32_t node, unsigned char b) const {
    auto it = edges_.find((static_cast<uint64_t>(node) << 8) | b);
    return it == edges_.end() ? -1 : it->second;
  }
  void encode_pieces(std::string_view s, std::vector<std::string_view>& pieces) const;

  std::vector<std::string> pieces_;
  std::vector<double> scores_;
  StringIdMap ids_;  // piece -> id (a duplicate piece maps to its last id, as HF)
  std::unordered_map<uint64_t, int32_t> edges_;
  std::vector<int32_t> node_piece_{-1};  // node 0 = root
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
  double min_score_ = 0;
  std::vector<int32_t> byte_ids_;  // <0xXX> ids, -1 when missing
  WordCache cache_;
};

}  // namespace moeserve::tok
