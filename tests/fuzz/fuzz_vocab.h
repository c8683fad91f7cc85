// A small byte vocabulary for the targets that compile structured-output constraints
// (fuzz_structured, fuzz_requests): the 256 single bytes (token id = byte value), some
// multi-byte tokens of JSON and text (so token masks have tokens that span grammar symbols),
// one special token and an EOS stop token, and padding ids up to mask_size. Shape:
// ids 0..255 bytes, 256.. kMulti, then <special>, <eos>; mask_size = that + 3.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "structured/matcher.h"

namespace moeserve::fuzz {

inline std::shared_ptr<const structured::TokenVocab> small_vocab() {
  static const std::shared_ptr<const structured::TokenVocab> v = [] {
    auto t = std::make_shared<structured::TokenVocab>();
    for (int b = 0; b < 256; ++b) t->token_bytes.push_back(std::string(1, static_cast<char>(b)));
    static const char* kMulti[] = {"{\"", "\":", "\": ", "\",", "\"}", "}}", "[{", "]}", "true", "false", "null",
                                   "  ", "\n", "\n  ", "12", "3.5", "-1", "e+", "abc", "hello", " world",
                                   "\\n", "\\u00", "é", "日本", "<tool_call>", "</tool_call>", "\"name\"",
                                   "\"arguments\"", "<invoke name=\"", "</invoke>", "<parameter name=\""};
    for (const char* m : kMulti) t->token_bytes.push_back(m);
    t->special.assign(t->token_bytes.size(), false);
    t->token_bytes.push_back("<special>");
    t->special.push_back(true);
    t->token_bytes.push_back("<eos>");
    t->special.push_back(true);
    t->stop_ids = {static_cast<int32_t>(t->token_bytes.size()) - 1};
    t->mask_size = static_cast<int32_t>(t->token_bytes.size()) + 3;
    t->build();
    return t;
  }();
  return v;
}

}  // namespace moeserve::fuzz
