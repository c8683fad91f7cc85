// Unit tests of the tokenizer internals and the incremental detokenizer. The bulk of the
// HF equivalence checks live in the Python oracle tests (test_*.py next to this file).
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <set>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

using moeserve::IncrementalDetokenizer;
using moeserve::Tokenizer;
namespace tok = moeserve::tok;

namespace {
const char* kQwen = MOESERVE_TEST_SHARED_DATA "/tokenizers/qwen3/tokenizer.json";

std::shared_ptr<const Tokenizer> qwen() {
  static std::shared_ptr<const Tokenizer> t = [] {
    const char* d = std::getenv("MOESERVE_SHARED_DATA");
    std::string p = d ? std::string(d) + "/tokenizers/qwen3/tokenizer.json" : kQwen;
    FILE* f = std::fopen(p.c_str(), "rb");
    if (!f) return std::shared_ptr<const Tokenizer>();
    std::fclose(f);
    return Tokenizer::from_file(p);
  }();
  return t;
}

// A tiny BPE: vocab a b c ab abc <0x..> for é's bytes, merges a+b then ab+c.
std::string tiny_json(const std::string& extra_model = "", const std::string& decoder = "null") {
  return R"({"version":"1.0","added_tokens":[{"id":9,"content":"<s>","special":true,"normalized":false,
    "lstrip":false,"rstrip":false,"single_word":false}],"normalizer":null,"pre_tokenizer":null,
    "post_processor":null,"decoder":)" + decoder + R"(,"model":{"type":"BPE","unk_token":"?",)" + extra_model +
         R"("vocab":{"a":0,"b":1,"c":2,"ab":3,"abc":4,"?":5,"<0xC3>":6,"<0xA9>":7,"bc":8},
    "merges":[["a","b"],["ab","c"],["b","c"]]}})";
}
}  // namespace

TEST(Unicode, LossyMatchesRustMaximalSubparts) {
  EXPECT_EQ(tok::utf8_lossy("a\xE2\x82" "b"), "a\xEF\xBF\xBD" "b");             // truncated 3-byte: one U+FFFD
  EXPECT_EQ(tok::utf8_lossy("\xF0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");          // F0 80: invalid second byte
  EXPECT_EQ(tok::utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(tok::utf8_lossy("\xE2\x82\xAC"), "\xE2\x82\xAC");
  EXPECT_EQ(tok::find_invalid_utf8("ok\xC0\xAF"), 2u);
  EXPECT_EQ(tok::find_invalid_utf8("\xF0\x9F\x98\x80"), std::string::npos);
}

TEST(Unicode, ByteLevelMapIsABijection) {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    char32_t c = tok::byte_to_cp()[b];
    EXPECT_TRUE(seen.insert(c).second);
    EXPECT_EQ(tok::cp_to_byte(c), b);
  }
  EXPECT_EQ(tok::byte_to_cp()[' '], 0x120u);  // 'Ġ'
  EXPECT_EQ(tok::byte_to_cp()['A'], static_cast<char32_t>('A'));
}

TEST(Bpe, MergesByRankAndUnknownAndByteFallback) {
  auto t = Tokenizer::from_json_string(tiny_json(), "tiny");
  EXPECT_EQ(t->encode("abc", false), (std::vector<int32_t>{4}));     // (a b) first, then (ab c)
  EXPECT_EQ(t->encode("bca", false), (std::vector<int32_t>{8, 0}));  // only b+c applies
  EXPECT_EQ(t->encode("aé", false), (std::vector<int32_t>{0, 5}));   // no byte_fallback -> unk
  auto bf = Tokenizer::from_json_string(tiny_json(R"("byte_fallback":true,)"), "tiny-bf");
  EXPECT_EQ(bf->encode("aé", false), (std::vector<int32_t>{0, 6, 7}));
  EXPECT_EQ(t->encode("a<s>b", false), (std::vector<int32_t>{0, 9, 1}));
  EXPECT_EQ(t->vocab_size(), 10u);
  EXPECT_TRUE(t->is_special(9));
  EXPECT_FALSE(t->is_special(4));
  EXPECT_EQ(t->decode({0, 9, 1}, true), "a b");  // no decoder: tokens joined by spaces
}

TEST(Tokenizer, RejectsInvalidUtf8AndUnsupportedComponents) {
  auto t = Tokenizer::from_json_string(tiny_json(), "tiny");
  EXPECT_THROW(t->encode("a\xFF", false), moeserve::Error);
  try {
    Tokenizer::from_json_string(tiny_json("", R"({"type":"NoSuchDecoder","prefix":"##"})"), "tiny");
    FAIL() << "expected an error";
  } catch (const moeserve::Error& e) {
    EXPECT_NE(std::string(e.what()).find("NoSuchDecoder"), std::string::npos) << e.what();
  }
}

// concat(deltas) == decode(ids) and each delta is valid UTF-8, on random ids biased to
// byte-level tokens of partial UTF-8 sequences (fixed seed).
TEST(IncrementalDetokenizer, ConcatEqualsDecodeOnRandomIds) {
  auto t = qwen();
  if (!t) GTEST_SKIP() << "qwen3 tokenizer.json not available";
  std::mt19937 rng(1234);
  std::vector<int32_t> partial;
  for (const char* s : {"Ã", "â", "ð", "Ł", "ł", "Ģ", "ĥ", "Ŀ", "Ġ", "Ċ"})
    if (auto id = t->token_to_id(s)) partial.push_back(*id);
  ASSERT_GE(partial.size(), 8u);
  std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(t->vocab_size()) - 1);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> ids(rng() % 50);
    for (auto& id : ids) id = (rng() % 3 == 0) ? partial[rng() % partial.size()] : any(rng);
    for (bool skip : {false, true}) {
      IncrementalDetokenizer d(t, skip);
      std::string all;
      for (int32_t id : ids) {
        std::string delta = d.push(id);
        EXPECT_EQ(tok::find_invalid_utf8(delta), std::string::npos);
        all += delta;
      }
      all += d.finish();
      EXPECT_EQ(all, t->decode(ids, skip)) << "trial " << trial;
    }
  }
}

TEST(IncrementalDetokenizer, HoldsPartialCharacters) {
  auto t = qwen();
  if (!t) GTEST_SKIP() << "qwen3 tokenizer.json not available";
  // "€" is E2 82 AC: byte-level chars â (E2), Ĥ (82... via map) -- use encode of bytes instead.
  auto ids = t->encode("€", false);
  std::vector<int32_t> split;
  for (char32_t c : {tok::byte_to_cp()[0xE2], tok::byte_to_cp()[0x82], tok::byte_to_cp()[0xAC]}) {
    std::string s;
    tok::append_utf8(s, c);
    auto id = t->token_to_id(s);
    ASSERT_TRUE(id.has_value());
    split.push_back(*id);
  }
  IncrementalDetokenizer d(t, false);
  EXPECT_EQ(d.push(split[0]), "");
  EXPECT_EQ(d.push(split[1]), "");
  EXPECT_EQ(d.push(split[2]), "€");
  EXPECT_EQ(d.finish(), "");
  IncrementalDetokenizer d2(t, false);
  EXPECT_EQ(d2.push(split[0]), "");
  EXPECT_EQ(d2.finish(), "\xEF\xBF\xBD");
  EXPECT_FALSE(ids.empty());
}
