#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "tokenizer/precompiled.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace moeserve::tok {

void unicode_normalize(std::string& s, NormForm form) {
  size_t n = s.size(), i = 0;
  while (i < n && static_cast<unsigned char>(s[i]) < 0x80) ++i;
  if (i == n) return;  // pure ASCII is invariant under every form
  int opts = UTF8PROC_STABLE;
  switch (form) {
    case NormForm::NFC: opts |= UTF8PROC_COMPOSE; break;
    case NormForm::NFD: opts |= UTF8PROC_DECOMPOSE; break;
    case NormForm::NFKC: opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormForm::NFKD: opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  // Normalize only the non-ASCII runs (with the ASCII character before each run, which
  // may be a base for combining marks). Cutting before an ASCII character is safe: ASCII
  // characters are starters that never compose with what precedes them.
  std::string out;
  out.reserve(n + n / 8);
  i = 0;
  while (i < n) {
    size_t j = i;
    while (j < n && static_cast<unsigned char>(s[j]) < 0x80) ++j;
    if (j == n) {
      out.append(s, i, n - i);
      break;
    }
    size_t seg = j > i ? j - 1 : j;
    out.append(s, i, seg - i);
    size_t k = j;
    while (k < n && static_cast<unsigned char>(s[k]) >= 0x80) ++k;
    utf8proc_uint8_t* dst = nullptr;
    auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + seg), static_cast<utf8proc_ssize_t>(k - seg),
                            &dst, static_cast<utf8proc_option_t>(opts));
    if (len < 0) fail("unicode normalization failed: {}", utf8proc_errmsg(len));
    out.append(reinterpret_cast<char*>(dst), static_cast<size_t>(len));
    std::free(dst);
    i = k;
  }
  s.swap(out);
}

namespace {

struct Unicode final : Normalizer {
  NormForm form;
  explicit Unicode(NormForm f) : form(f) {}
  void normalize(std::string& s) const override { unicode_normalize(s, form); }
};

// Rust char::to_lowercase: the simple mapping except U+0130, whose full mapping is "i̇".
struct Lowercase final : Normalizer {
  void normalize(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
      auto b = static_cast<unsigned char>(s[i]);
      if (b < 0x80) {
        out.push_back(static_cast<char>(b >= 'A' && b <= 'Z' ? b + 32 : b));
        ++i;
        continue;
      }
      char32_t c = next_cp(s, i);
      if (c == 0x130) {
        out.append("i\xCC\x87");
        continue;
      }
      append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
    s.swap(out);
  }
};

struct Replace final : Normalizer {
  std::unique_ptr<Regex> re;
  std::string content;
  void normalize(std::string& s) const override {
    std::vector<std::pair<size_t, size_t>> m;
    re->find_all(s, m);
    if (m.empty()) return;
    std::string out;
    size_t prev = 0;
    for (auto [b, e] : m) {
      out.append(s, prev, b - prev);
      out.append(content);
      prev = e;
    }
    out.append(s, prev, std::string::npos);
    s.swap(out);
  }
};

struct Prepend final : Normalizer {
  std::string prefix;
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prefix);
  }
};

struct Strip final : Normalizer {
  bool left = true, right = true;
  void normalize(std::string& s) const override {
    size_t b = 0, e = s.size();
    if (left) {
      while (b < e) {
        size_t k = b;
        if (!is_white_space(next_cp(s, k))) break;
        b = k;
      }
    }
    if (right) {
      while (e > b) {
        size_t k = e;
        if (!is_white_space(prev_cp(s, k))) break;
        e = k;
      }
    }
    s = s.substr(b, e - b);
  }
};

struct StripAccents final : Normalizer {
  void normalize(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
      size_t b = i;
      char32_t c = next_cp(s, i);
      if (!is_mark(c)) out.append(s, b, i - b);
    }
    s.swap(out);
  }
};

struct ByteLevelNorm final : Normalizer {
  void normalize(std::string& s) const override {
    const auto& t = byte_to_utf8();
    std::string out;
    out.reserve(s.size() * 2);
    for (unsigned char b : s) out.append(t[b]);
    s.swap(out);
  }
};

// HF BertNormalizer: clean_text drops NUL, U+FFFD and "other" characters (Cc, Cf, Co of
// the unicode_categories crate's tables, tab/newline/CR excepted) and maps whitespace to ' ';
// handle_chinese_chars puts spaces around CJK ideographs; strip_accents (default: as
// lowercase) is NFD then dropping non-spacing marks; lowercase is Rust's to_lowercase.
struct BertNorm final : Normalizer {
  bool clean_text = true, chinese = true, strip_accents = true, lowercase = true;
  static bool is_chinese(char32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
  }
  void normalize(std::string& s) const override {
    if (clean_text || chinese) {
      std::string out;
      out.reserve(s.size() + 8);
      size_t i = 0;
      while (i < s.size()) {
        size_t b = i;
        char32_t c = next_cp(s, i);
        if (clean_text) {
          if (c == 0 || c == 0xFFFD || (c != '\t' && c != '\n' && c != '\r' && is_bert_other(c))) continue;
          if (is_white_space(c)) {
            out.push_back(' ');
            continue;
          }
        }
        if (chinese && is_chinese(c)) {
          out.push_back(' ');
          out.append(s, b, i - b);
          out.push_back(' ');
        } else {
          out.append(s, b, i - b);
        }
      }
      s.swap(out);
    }
    if (strip_accents) {
      unicode_normalize(s, NormForm::NFD);
      std::string out;
      out.reserve(s.size());
      size_t i = 0;
      while (i < s.size()) {
        size_t b = i;
        if (!is_nonspacing_mark(next_cp(s, i))) out.append(s, b, i - b);
      }
      s.swap(out);
    }
    if (lowercase) Lowercase().normalize(s);
  }
};

// HF Nmt: drops ASCII control characters and maps other "space-like" ones to ' '.
struct Nmt final : Normalizer {
  void normalize(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
      size_t b = i;
      char32_t c = next_cp(s, i);
      if ((c >= 0x01 && c <= 0x08) || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F || c == 0x8F || c == 0x9F) continue;
      if (c == 0x09 || c == 0x0A || c == 0x0C || c == 0x0D || c == 0x1680 || (c >= 0x200B && c <= 0x200F) || c == 0x2028 ||
          c == 0x2029 || c == 0x2581 || c == 0xFEFF || c == 0xFFFD)
        out.push_back(' ');
      else
        out.append(s, b, i - b);
    }
    s.swap(out);
  }
};

struct Sequence final : Normalizer {
  std::vector<std::unique_ptr<Normalizer>> items;
  void normalize(std::string& s) const override {
    for (auto& n : items) n->normalize(s);
  }
};

}  // namespace

// {"String": "..."} or {"Regex": "..."} -> compiled pattern.
std::unique_ptr<Regex> make_pattern(const nlohmann::json& p, const char* where) {
  if (p.is_object() && p.contains("String")) return std::make_unique<Regex>(p["String"].get<std::string>(), true);
  if (p.is_object() && p.contains("Regex")) return std::make_unique<Regex>(p["Regex"].get<std::string>(), false);
  if (p.is_string()) return std::make_unique<Regex>(p.get<std::string>(), true);
  fail("tokenizer.json {}: pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}, got {}", where, p.dump());
}

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  MS_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), "normalizer without a 'type': {}", j.dump().substr(0, 200));
  std::string type = j["type"].get<std::string>();
  if (type == "NFC") return std::make_unique<Unicode>(NormForm::NFC);
  if (type == "NFD") return std::make_unique<Unicode>(NormForm::NFD);
  if (type == "NFKC") return std::make_unique<Unicode>(NormForm::NFKC);
  if (type == "NFKD") return std::make_unique<Unicode>(NormForm::NFKD);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "ByteLevel") return std::make_unique<ByteLevelNorm>();
  if (type == "Replace") {
    auto r = std::make_unique<Replace>();
    r->re = make_pattern(j.at("pattern"), "normalizer Replace");
    r->content = j.at("content").get<std::string>();
    return r;
  }
  if (type == "Prepend") {
    auto r = std::make_unique<Prepend>();
    r->prefix = j.at("prepend").get<std::string>();
    return r;
  }
  if (type == "Strip") {
    auto r = std::make_unique<Strip>();
    r->left = j.value("strip_left", true);
    r->right = j.value("strip_right", true);
    return r;
  }
  if (type == "BertNormalizer") {
    auto r = std::make_unique<BertNorm>();
    auto flag = [&](const char* k, bool d) {
      if (!j.contains(k) || j[k].is_null()) return d;
      MS_CHECK(j[k].is_boolean(), "normalizer BertNormalizer: '{}' must be a boolean", k);
      return j[k].get<bool>();
    };
    r->clean_text = flag("clean_text", true);
    r->chinese = flag("handle_chinese_chars", true);
    r->lowercase = flag("lowercase", true);
    r->strip_accents = flag("strip_accents", r->lowercase);
    return r;
  }
  if (type == "Nmt") return std::make_unique<Nmt>();
  if (type == "Precompiled") {
    MS_CHECK(j.contains("precompiled_charsmap") && j["precompiled_charsmap"].is_string(),
             "normalizer Precompiled: 'precompiled_charsmap' must be a base64 string");
    return std::make_unique<Precompiled>(base64_decode(j["precompiled_charsmap"].get<std::string>()));
  }
  if (type == "Sequence") {
    auto r = std::make_unique<Sequence>();
    for (auto& n : j.at("normalizers")) {
      auto item = make_normalizer(n);
      if (item) r->items.push_back(std::move(item));
    }
    return r;
  }
  fail("unsupported normalizer type '{}'", type);
}

}  // namespace moeserve::tok
