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

Regex::Regex(const std::string& pattern, bool literal) : pattern_(pattern) {
  // MULTILINE: Oniguruma's Ruby syntax treats ^ and $ as line anchors.
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE | (literal ? PCRE2_LITERAL : 0);
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
