// PCRE2 wrapper for tokenizer patterns (UTF + UCP, JIT-compiled). HF `tokenizers` runs
// its patterns with Oniguruma (Ruby syntax); the patterns found in tokenizer.json files
// (GPT-2, cl100k/o200k style) mean the same under PCRE2 with these options.
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moeserve::tok {

class Regex {
 public:
  // literal=true matches `pattern` as a plain string. Throws moeserve::Error on a bad pattern.
  Regex(const std::string& pattern, bool literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // All non-overlapping matches as [begin, end) byte offsets, left to right. `s` must be
  // valid UTF-8 (not re-checked). After an empty match the search moves one character on.
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code*
  bool jit_ = false;
};

// tokenizer.json pattern {"String": ...} | {"Regex": ...} -> compiled Regex (`where` names the
// component in errors). Defined in normalizer.cpp.
std::unique_ptr<Regex> make_pattern(const nlohmann::json& p, const char* where);

}  // namespace moeserve::tok
