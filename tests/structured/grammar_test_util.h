// Helpers shared by the structured-output tests: a one-token-per-byte vocabulary, language
// membership through the matcher, and the text of a schema's compile error.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "structured/json_schema.h"
#include "structured/matcher.h"

namespace moeserve::structured::testing {

// One token per byte value (id = byte), plus EOS = 256.
inline std::shared_ptr<const TokenVocab> byte_vocab() {
  static auto v = [] {
    auto voc = std::make_shared<TokenVocab>();
    for (int b = 0; b < 256; ++b) voc->token_bytes.push_back(std::string(1, char(b)));
    voc->token_bytes.push_back("<eos>");
    voc->special.assign(257, false);
    voc->special[256] = true;
    voc->stop_ids = {256};
    voc->build();
    return voc;
  }();
  return v;
}

// True when the grammar's language holds s, fed byte by byte as tokens.
inline bool matches(const Grammar& g, std::string_view s) {
  auto cg = std::make_shared<CompiledGrammar>(g, byte_vocab());
  Matcher m(cg);
  for (unsigned char c : s)
    if (!m.accept_token(c)) return false;
  return m.accepting();
}

// The GrammarError text compiling the schema raises, or "no error".
inline std::string schema_error(const std::string& schema) {
  try {
    grammar_from_json_schema_text(schema);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace moeserve::structured::testing
