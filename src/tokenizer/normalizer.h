// Normalizers of tokenizer.json (`normalizer`): NFC/NFD/NFKC/NFKD (utf8proc), Lowercase,
// Replace, Prepend, Strip, StripAccents, ByteLevel, Sequence. Offsets are not tracked:
// moeserve only needs ids. Unsupported types fail at load with their name.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace moeserve::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& s) const = 0;
};

// Returns nullptr for a JSON null. Throws moeserve::Error naming an unsupported type.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j);

// Unicode normalization forms via utf8proc; `s` must be valid UTF-8.
enum class NormForm { NFC, NFD, NFKC, NFKD };
void unicode_normalize(std::string& s, NormForm form);

}  // namespace moeserve::tok
