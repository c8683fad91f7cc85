#include "tokenizer/precompiled.h"

#include <utf8proc.h>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace moeserve::tok {

std::string base64_decode(std::string_view in) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  MS_CHECK(in.size() % 4 == 0, "base64: length {} is not a multiple of 4", in.size());
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      char c = in[i + static_cast<size_t>(k)];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      MS_CHECK(pad == 0, "base64: '=' inside the data at offset {}", i + static_cast<size_t>(k));
      v[k] = val(c);
      MS_CHECK(v[k] >= 0, "base64: invalid character 0x{:02X} at offset {}", static_cast<unsigned>(static_cast<unsigned char>(c)),
               i + static_cast<size_t>(k));
    }
    uint32_t n = (static_cast<uint32_t>(v[0]) << 18) | (static_cast<uint32_t>(v[1]) << 12) | (static_cast<uint32_t>(v[2]) << 6) |
                 static_cast<uint32_t>(v[3]);
    out.push_back(static_cast<char>((n >> 16) & 0xFF));
    if (pad < 2) out.push_back(static_cast<char>((n >> 8) & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(n & 0xFF));
  }
  return out;
}

Precompiled::Precompiled(std::string_view blob) {
  MS_CHECK(blob.size() >= 4, "Precompiled normalizer: cannot parse precompiled_charsmap ({} bytes, need at least 4)", blob.size());
  auto le32 = [&](size_t off) {
    return static_cast<uint32_t>(static_cast<unsigned char>(blob[off])) | (static_cast<uint32_t>(static_cast<unsigned char>(blob[off + 1])) << 8) |
           (static_cast<uint32_t>(static_cast<unsigned char>(blob[off + 2])) << 16) |
           (static_cast<uint32_t>(static_cast<unsigned char>(blob[off + 3])) << 24);
  };
  size_t trie_bytes = le32(0);
  size_t units = trie_bytes / 4;
  MS_CHECK(units <= (blob.size() - 4) / 4, "Precompiled normalizer: cannot parse precompiled_charsmap (trie of {} bytes, blob of {})",
           trie_bytes, blob.size());
  trie_.resize(units);
  for (size_t k = 0; k < units; ++k) trie_[k] = le32(4 + 4 * k);
  normalized_ = std::string(blob.substr(4 + 4 * units));
  MS_CHECK(find_invalid_utf8(normalized_) == std::string::npos,
           "Precompiled normalizer: the normalized strings of precompiled_charsmap are not UTF-8");
}

std::optional<std::string_view> Precompiled::transform(std::string_view key) const {
  // darts-clone unit: label = bits 0-7 (+ bit 31), has_leaf = bit 8, offset = bits 10-31
  // shifted by 8 more when bit 9 is set; a leaf unit's value is its low 31 bits.
  auto offset = [](uint32_t u) { return static_cast<size_t>(u >> 10) << ((u & (1u << 9)) >> 6); };
  if (trie_.empty()) return std::nullopt;
  size_t pos = offset(trie_[0]);
  for (unsigned char c : key) {
    if (c == 0) break;
    pos ^= c;
    if (pos >= trie_.size()) return std::nullopt;
    uint32_t unit = trie_[pos];
    if ((unit & ((1u << 31) | 0xFFu)) != c) return std::nullopt;
    pos ^= offset(unit);
    if ((unit >> 8) & 1) {
      if (pos >= trie_.size()) return std::nullopt;
      size_t idx = trie_[pos] & ((1u << 31) - 1);
      if (idx > normalized_.size()) return std::nullopt;
      size_t end = normalized_.find('\0', idx);
      if (end == std::string::npos) end = normalized_.size();
      std::string_view r(normalized_.data() + idx, end - idx);
      if (find_invalid_utf8(r) != std::string_view::npos) return std::nullopt;
      return r;  // the first (shortest) key found, as spm_precompiled's transform
    }
  }
  return std::nullopt;
}

void Precompiled::normalize(std::string& s) const {
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  size_t i = 0;
  while (i < s.size()) {
    // One extended grapheme cluster [i, j).
    size_t j = i;
    char32_t prev = next_cp(s, j);
    utf8proc_int32_t state = 0;
    while (j < s.size()) {
      size_t k = j;
      char32_t c = next_cp(s, k);
      if (utf8proc_grapheme_break_stateful(static_cast<utf8proc_int32_t>(prev), static_cast<utf8proc_int32_t>(c), &state)) break;
      prev = c;
      j = k;
    }
    std::string_view g(s.data() + i, j - i);
    if (g.size() < 6) {
      if (auto r = transform(g)) {
        out.append(*r);
        i = j;
        continue;
      }
    }
    while (i < j) {
      size_t b = i;
      next_cp(s, i);
      std::string_view ch(s.data() + b, i - b);
      if (auto r = transform(ch)) out.append(*r);
      else out.append(ch);
    }
  }
  s.swap(out);
}

}  // namespace moeserve::tok
