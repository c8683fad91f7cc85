#include "tokenizer/regex.h"

#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace moeserve::tok {
namespace {
// One match-data block per thread (grown on demand); pcre2 match data is not shareable
// across concurrent matches, and allocating one per call costs more than the match.
struct ThreadMatch {
  pcre2_match_data* md = nullptr;
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* mctx = nullptr;
  ThreadMatch() {
    md = pcre2_match_data_create(32, nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    pcre2_jit_stack_assign(mctx, nullptr, stack);
  }
  ~ThreadMatch() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mctx);
    pcre2_jit_stack_free(stack);
  }
};
ThreadMatch& thread_match() {
  thread_local ThreadMatch tm;
  return tm;
}
}  // namespace

namespace {
// Oniguruma (what HF runs) and PCRE2 10.42 disagree on two Unicode classes, so they are
// spelled out: \w is Letter | Mark | Decimal_Number | Connector_Punctuation | Join_Control
// in Oniguruma (PCRE2 lacks the marks), and \s is White_Space (PCRE2 adds U+180E).
// \W and \S are rewritten outside character classes only.
std::string onig_compat(const std::string& p) {
  static const std::string kWord = R"(\p{L}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D})";
  static const std::string kSpace = R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char n = p[i + 1];
      const std::string* set = n == 'w' || n == 'W' ? &kWord : n == 's' || n == 'S' ? &kSpace : nullptr;
      bool neg = n == 'W' || n == 'S';
      if (set && in_class && !neg) out += *set;
      else if (set && !in_class) out += (neg ? "[^" : "[") + *set + "]";
      else out += p.substr(i, 2);
      ++i;
      continue;
    }
    if (c == '[' && !in_class) in_class = true;
    else if (c == ']' && in_class && out.back() != '[' && out.back() != '^') in_class = false;
    out.push_back(c);
  }
  return out;
}
}  // namespace

Regex::Regex(const std::string& pattern_in, bool literal) : pattern_(pattern_in) {
  std::string pattern = literal ? pattern_in : onig_compat(pattern_in);
  // MULTILINE: Oniguruma's Ruby syntax treats ^ and $ as line anchors.
  uint32_t opts = literal ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE);
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    fail("tokenizer regex '{}' does not compile at offset {}: {}", pattern, off, reinterpret_cast<char*>(buf));
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  ThreadMatch& tm = thread_match();
  auto subj = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  while (pos <= s.size()) {
    int rc = jit_ ? pcre2_jit_match(code, subj, s.size(), pos, 0, tm.md, tm.mctx)
                  : pcre2_match(code, subj, s.size(), pos, PCRE2_NO_UTF_CHECK, tm.md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(rc, buf, sizeof(buf));
      fail("tokenizer regex '{}' failed: {}", pattern_, reinterpret_cast<char*>(buf));
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(tm.md);
    size_t b = ov[0], e = ov[1];
    out.emplace_back(b, e);
    if (e > b) {
      pos = e;
    } else {
      if (e >= s.size()) break;
      pos = e + utf8_len_of_lead(static_cast<unsigned char>(s[e]));
    }
  }
}

}  // namespace moeserve::tok
