// sentencepiece's precompiled_charsmap normalizer (`{"type": "Precompiled"}`), as HF runs it.
// The charsmap (base64 in tokenizer.json) is [u32 LE trie size in bytes][double-array trie
// (darts-clone units, u32 LE)][normalized strings, each NUL-terminated]. The trie maps a
// UTF-8 key to the offset of its replacement. HF walks extended grapheme clusters: a
// cluster shorter than 6 bytes is replaced as a whole when any prefix of it is a key (the
// shortest such key's replacement is used, as spm_precompiled's `transform` does); otherwise
// each character is replaced on its own when it is a key.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/normalizer.h"

namespace moeserve::tok {

class Precompiled final : public Normalizer {
 public:
  // `blob` is the decoded charsmap; throws moeserve::Error when it cannot be parsed.
  explicit Precompiled(std::string_view blob);
  void normalize(std::string& s) const override;
  // Replacement of the shortest key that prefixes `chunk`, if any.
  std::optional<std::string_view> transform(std::string_view chunk) const;

 private:
  std::vector<uint32_t> trie_;
  std::string normalized_;
};

// Standard base64 (RFC 4648 alphabet, '=' padding). Throws moeserve::Error on bad input.
std::string base64_decode(std::string_view in);

}  // namespace moeserve::tok
