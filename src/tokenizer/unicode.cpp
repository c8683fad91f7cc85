#include "tokenizer/unicode.h"

#include <iterator>

#include <utf8proc.h>

namespace moeserve::tok {
namespace {
// Length of the invalid prefix at s[i] (>= 1) per Rust's Utf8Chunks, or 0 when a valid
// character starts there; `len` receives the valid character's length.
size_t invalid_len(std::string_view s, size_t i, size_t* len) {
  auto at = [&](size_t k) -> int { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : -1; };
  int b = at(0);
  auto cont = [](int x) { return x >= 0x80 && x <= 0xBF; };
  if (b < 0x80) { *len = 1; return 0; }
  if (b >= 0xC2 && b <= 0xDF) {
    if (!cont(at(1))) return 1;
    *len = 2;
    return 0;
  }
  if (b >= 0xE0 && b <= 0xEF) {
    int c = at(1);
    bool ok = (b == 0xE0) ? (c >= 0xA0 && c <= 0xBF) : (b == 0xED) ? (c >= 0x80 && c <= 0x9F) : cont(c);
    if (!ok) return 1;
    if (!cont(at(2))) return 2;
    *len = 3;
    return 0;
  }
  if (b >= 0xF0 && b <= 0xF4) {
    int c = at(1);
    bool ok = (b == 0xF0) ? (c >= 0x90 && c <= 0xBF) : (b == 0xF4) ? (c >= 0x80 && c <= 0x8F) : cont(c);
    if (!ok) return 1;
    if (!cont(at(2))) return 2;
    if (!cont(at(3))) return 3;
    *len = 4;
    return 0;
  }
  return 1;
}
}  // namespace

size_t find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) { ++i; continue; }
    size_t len = 0;
    if (invalid_len(s, i, &len) != 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

char32_t prev_cp(std::string_view s, size_t& i) {
  size_t j = i - 1;
  while (j > 0 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
  size_t k = j;
  char32_t c = next_cp(s, k);
  i = j;
  return c;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t len = 0;
    size_t bad = invalid_len(s, i, &len);
    if (bad == 0) {
      out.append(s.data() + i, len);
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      i += bad;
    }
  }
  return out;
}

bool ends_with_replacement(std::string_view s) {
  return s.size() >= 3 && s.substr(s.size() - 3) == "\xEF\xBF\xBD";
}

namespace {
struct ByteTables {
  std::array<char32_t, 256> b2c{};
  std::array<std::string, 256> b2s;
  std::array<int, 512> c2b{};
  ByteTables() {
    c2b.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      b2c[b] = direct ? b : 256 + n++;
      c2b[b2c[b]] = b;
      append_utf8(b2s[b], b2c[b]);
    }
  }
};
const ByteTables& tables() {
  static const ByteTables t;
  return t;
}
}  // namespace

const std::array<char32_t, 256>& byte_to_cp() { return tables().b2c; }
const std::array<std::string, 256>& byte_to_utf8() { return tables().b2s; }
int cp_to_byte(char32_t c) { return c < 512 ? tables().c2b[c] : -1; }

bool is_white_space(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static utf8proc_category_t category(char32_t c) {
  return static_cast<utf8proc_category_t>(utf8proc_category(static_cast<utf8proc_int32_t>(c)));
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  auto k = category(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  auto k = category(c);
  return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ME) || k == UTF8PROC_CATEGORY_ND ||
         k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC || c == 0x200C || c == 0x200D;
}


namespace {
struct CpRange {
  char32_t lo, hi;
};
#include "tokenizer/bert_tables.inc"
template <size_t N>
bool in_ranges(const CpRange (&t)[N], char32_t c) {
  size_t lo = 0, hi = N;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (t[mid].hi < c) lo = mid + 1;
    else hi = mid;
  }
  return lo < N && t[lo].lo <= c;
}
}  // namespace

// HF is_punc: ASCII punctuation or the unicode_categories crate's (pre-Unicode-9) P* tables.
bool is_punctuation(char32_t c) { return in_ranges(kBertPunctuation, c); }
// StripAccents: the combining marks of the unicode-normalization tables HF uses.
bool is_mark(char32_t c) { return c >= 0x300 && in_ranges(kStripAccentsMark, c); }
bool is_bert_other(char32_t c) { return in_ranges(kBertOther, c); }

namespace {
struct ScriptRange {
  char32_t lo, hi;
  int cls;
};
#include "tokenizer/scripts_table.inc"
}  // namespace

int script_class(char32_t c) {
  size_t lo = 0, hi = std::size(kScriptRanges);
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (kScriptRanges[mid].hi < c) lo = mid + 1;
    else hi = mid;
  }
  return lo < std::size(kScriptRanges) && kScriptRanges[lo].lo <= c ? kScriptRanges[lo].cls : -1;
}
bool is_nonspacing_mark(char32_t c) { return c >= 0x300 && in_ranges(kBertNonspacingMark, c); }

}  // namespace moeserve::tok
