// Test helpers for the tool-call grammars: a byte-level vocabulary (ids 0-255 the bytes, 256
// a special stop token) and random documents of a grammar drawn through its Matcher.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "structured/matcher.h"

namespace moeserve::server::grammar_docs {

inline std::shared_ptr<structured::TokenVocab> byte_vocab() {
  auto v = std::make_shared<structured::TokenVocab>();
  for (int b = 0; b < 256; ++b) v->token_bytes.push_back(std::string(1, char(b)));
  v->token_bytes.push_back("");
  v->special.assign(257, false);
  v->special[256] = true;
  v->stop_ids = {256};
  v->build();
  return v;
}

// Random allowed bytes until the stop token is drawn (taken with probability 1/2 whenever it
// is allowed); each of `favoured` is taken with probability 1/4 when allowed, so values,
// strings and containers end.
inline std::string random_document(structured::Matcher& m, std::mt19937& rng, std::initializer_list<int> favoured) {
  std::string out;
  std::vector<uint32_t> mask(m.mask_words());
  for (int step = 0; step < 20000; ++step) {
    m.fill_mask(mask);
    std::vector<int> allowed;
    for (int id = 0; id < 257; ++id)
      if ((mask[id >> 5] >> (id & 31)) & 1) allowed.push_back(id);
    EXPECT_FALSE(allowed.empty());
    if (allowed.empty()) return out;
    auto has = [&](int x) { return std::count(allowed.begin(), allowed.end(), x) > 0; };
    int pick = allowed[rng() % allowed.size()];
    if (has(256) && rng() % 2) pick = 256;
    else
      for (int x : favoured)
        if (has(x) && rng() % 4 == 0) pick = x;
    if (pick == 256) return out;
    EXPECT_TRUE(m.accept_token(pick));
    out.push_back(char(pick));
  }
  ADD_FAILURE() << "document did not end";
  return out;
}

}  // namespace moeserve::server::grammar_docs
