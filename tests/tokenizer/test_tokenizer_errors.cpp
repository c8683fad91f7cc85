// Malformed tokenizer.json files must fail at load with a moeserve::Error whose message
// says what is wrong (and where), never crash; plus small hand-checked cases of the
// non-BPE models (the HF comparisons are in test_model_types.py).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

using moeserve::Tokenizer;

namespace {

struct Parts {
  std::string model = R"({"type":"BPE","unk_token":null,"vocab":{"a":0,"b":1,"ab":2,"c":3},"merges":["a b"]})";
  std::string added = "[]";
  std::string normalizer = "null", pre = "null", post = "null", decoder = "null";
  std::string json() const {
    return R"({"version":"1.0","truncation":null,"padding":null,"added_tokens":)" + added + R"(,"normalizer":)" + normalizer +
           R"(,"pre_tokenizer":)" + pre + R"(,"post_processor":)" + post + R"(,"decoder":)" + decoder + R"(,"model":)" + model + "}";
  }
};

// Loading `json` must throw moeserve::Error mentioning every string of `needles`.
void expect_load_error(const std::string& json, std::initializer_list<const char*> needles) {
  try {
    Tokenizer::from_json_string(json, "bad.json");
    ADD_FAILURE() << "loaded without error: " << json.substr(0, 300);
  } catch (const moeserve::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("bad.json"), std::string::npos) << msg;  // the origin is named
    for (const char* n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' missing from: " << msg;
  }
}

}  // namespace

TEST(TokenizerErrors, InvalidAndTruncatedJson) {
  expect_load_error("{not json", {"not valid JSON"});
  std::string good = Parts().json();
  for (size_t cut : {size_t{0}, size_t{1}, good.size() / 3, good.size() / 2, good.size() - 1})
    expect_load_error(good.substr(0, cut), {"not valid JSON"});
  expect_load_error("[1,2]", {"top level must be a JSON object"});
  // A truncated file on disk: the path is in the message.
  std::string path = ::testing::TempDir() + "/truncated_tokenizer.json";
  std::ofstream(path) << good.substr(0, good.size() / 2);
  try {
    Tokenizer::from_file(path);
    ADD_FAILURE() << "truncated file loaded";
  } catch (const moeserve::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
  EXPECT_THROW(Tokenizer::from_file(path + ".missing"), moeserve::Error);
}

TEST(TokenizerErrors, MissingOrUnknownComponents) {
  expect_load_error(R"({"version":"1.0","added_tokens":[]})", {"no 'model'"});
  Parts p;
  p.model = R"("BPE")";
  expect_load_error(p.json(), {"'model' must be an object"});
  p = Parts();
  p.model = R"({"type":"SuperBPE","vocab":{}})";
  expect_load_error(p.json(), {"model type 'SuperBPE'"});
  p = Parts();
  p.normalizer = R"({"type":"NFX"})";
  expect_load_error(p.json(), {"normalizer type 'NFX'"});
  p = Parts();
  p.normalizer = R"({"type":"Sequence","normalizers":[{"type":"NFC"},{"type":"Lowercase2"}]})";
  expect_load_error(p.json(), {"normalizer type 'Lowercase2'"});
  p = Parts();
  p.pre = R"({"type":"MagicSplit"})";
  expect_load_error(p.json(), {"pre_tokenizer type 'MagicSplit'"});
  p = Parts();
  p.decoder = R"({"type":"Sequence","decoders":[{"type":"Unbyte"}]})";
  expect_load_error(p.json(), {"decoder type 'Unbyte'"});
  p = Parts();
  p.post = R"({"type":"PostMagic"})";
  expect_load_error(p.json(), {"post_processor type 'PostMagic'"});
  p = Parts();
  p.decoder = R"({"prefix":"##"})";
  expect_load_error(p.json(), {"decoder without a 'type'"});
}

TEST(TokenizerErrors, BadMerges) {
  Parts p;
  p.model = R"({"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b","a zz"]})";
  expect_load_error(p.json(), {"merges[1]", "zz"});
  p.model = R"({"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":[["a","q"]]})";
  expect_load_error(p.json(), {"merges[0]", "q"});
  p.model = R"({"type":"BPE","vocab":{"a":0,"b":1},"merges":["a b"]})";
  expect_load_error(p.json(), {"merges[0]", "'ab'"});  // the merge result is missing
  p.model = R"({"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b c"]})";
  expect_load_error(p.json(), {"merges[0]", "one space"});
  p.model = R"({"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":[[1,2]]})";
  expect_load_error(p.json(), {"merges[0]"});
  p.model = R"({"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":{"a":"b"}})";
  expect_load_error(p.json(), {"merges must be an array"});
}

TEST(TokenizerErrors, BothMergeFormatsAgree) {
  Parts legacy, pairs;
  legacy.model = R"({"type":"BPE","vocab":{"a":0,"b":1,"c":2,"ab":3,"abc":4},"merges":["a b","ab c"]})";
  pairs.model = R"({"type":"BPE","vocab":{"a":0,"b":1,"c":2,"ab":3,"abc":4},"merges":[["a","b"],["ab","c"]]})";
  auto t1 = Tokenizer::from_json_string(legacy.json(), "legacy");
  auto t2 = Tokenizer::from_json_string(pairs.json(), "pairs");
  for (const char* s : {"abc", "abab", "cab", "abcabc"}) EXPECT_EQ(t1->encode(s, false), t2->encode(s, false)) << s;
  EXPECT_EQ(t1->encode("abcab", false), (std::vector<int32_t>{4, 3}));
}

TEST(TokenizerErrors, BadVocabIds) {
  Parts p;
  p.model = R"({"type":"BPE","vocab":{"a":0,"b":0},"merges":[]})";
  expect_load_error(p.json(), {"both have id 0"});
  p.model = R"({"type":"BPE","vocab":{"a":0,"b":999999999},"merges":[]})";
  expect_load_error(p.json(), {"999999999", "out of range", "'b'"});
  p.model = R"({"type":"WordPiece","vocab":{"a":-1}})";
  expect_load_error(p.json(), {"-1", "out of range"});
  p.model = R"({"type":"WordLevel","vocab":{"a":"zero"}})";
  expect_load_error(p.json(), {"'a'", "not an integer"});
  p.model = R"({"type":"BPE","vocab":["a","b"],"merges":[]})";
  expect_load_error(p.json(), {"must be an object"});
  p.model = R"({"type":"Unigram","unk_id":5,"vocab":[["<unk>",0.0],["a",-1.0]]})";
  expect_load_error(p.json(), {"unk_id 5 is out of range"});
  p.model = R"({"type":"Unigram","unk_id":0,"vocab":[["<unk>",0.0],["a"]]})";
  expect_load_error(p.json(), {"vocab[1]"});
}

TEST(TokenizerErrors, CollidingAddedTokenIds) {
  Parts p;
  p.added = R"([{"id":4,"content":"<x>","special":true},{"id":4,"content":"<y>","special":true}])";
  expect_load_error(p.json(), {"'<x>'", "'<y>'", "both have id 4"});
  p.added = R"([{"id":1,"content":"<x>","special":true}])";  // id 1 is "b" in the model vocab
  expect_load_error(p.json(), {"'<x>'", "id 1", "'b'"});
  p.added = R"([{"id":1,"special":true}])";
  expect_load_error(p.json(), {"added_tokens[0]", "content"});
  // Listed ids that agree with HF's assignment load fine, also for a token of the vocab.
  p.added = R"([{"id":4,"content":"<x>","special":true},{"id":2,"content":"ab","special":false}])";
  auto t = Tokenizer::from_json_string(p.json(), "ok");
  EXPECT_EQ(t->token_to_id("<x>"), 4);
  EXPECT_EQ(t->encode("a<x>ab", false), (std::vector<int32_t>{0, 4, 2}));
}

TEST(TokenizerErrors, InvalidRegexNamesThePattern) {
  Parts p;
  p.pre = R"({"type":"Split","pattern":{"Regex":"(a|b"},"behavior":"Isolated","invert":false})";
  expect_load_error(p.json(), {"(a|b", "does not compile"});
  p.normalizer = R"({"type":"Replace","pattern":{"Regex":"[z-a]"},"content":"x"})";
  p.pre = "null";
  expect_load_error(p.json(), {"[z-a]", "does not compile"});
  p.normalizer = "null";
  p.pre = R"({"type":"Split","pattern":{"Regex":"a"},"behavior":"Sideways","invert":false})";
  expect_load_error(p.json(), {"Sideways"});
}

TEST(TokenizerErrors, BadPrecompiledCharsmap) {
  Parts p;
  p.normalizer = R"({"type":"Precompiled","precompiled_charsmap":"not base64!"})";
  expect_load_error(p.json(), {"base64"});
  p.normalizer = R"({"type":"Precompiled","precompiled_charsmap":"AAA="})";  // 2 bytes
  expect_load_error(p.json(), {"precompiled_charsmap"});
  p.normalizer = R"({"type":"Precompiled","precompiled_charsmap":"/////w=="})";  // trie larger than the blob
  expect_load_error(p.json(), {"precompiled_charsmap"});
  p.normalizer = R"({"type":"Precompiled","precompiled_charsmap":null})";
  expect_load_error(p.json(), {"precompiled_charsmap"});
}

TEST(Models, UnigramViterbiAndFusedUnk) {
  // HF's documented example: "abcdacdxx" -> abcd a cd xx (the two unknown x fused).
  Parts p;
  p.model = R"({"type":"Unigram","unk_id":0,"vocab":[["<unk>",0.0],["a",0.0],["b",0.0],["c",0.0],["d",0.0],
               ["cd",1.0],["ab",2.0],["abc",5.0],["abcd",10.0]]})";
  auto t = Tokenizer::from_json_string(p.json(), "unigram");
  EXPECT_EQ(t->encode("abcdacdxx", false), (std::vector<int32_t>{8, 1, 5, 0}));
  EXPECT_EQ(t->decode({8, 1, 5, 0}, false), "abcd a cd <unk>");  // no decoder: joined by spaces
  p.model = R"({"type":"Unigram","unk_id":null,"vocab":[["a",0.0]]})";
  auto no_unk = Tokenizer::from_json_string(p.json(), "unigram-nounk");
  EXPECT_EQ(no_unk->encode("aa", false), (std::vector<int32_t>{0, 0}));
  EXPECT_THROW(no_unk->encode("ab", false), moeserve::Error);
}

TEST(Models, WordPieceGreedyLongestMatch) {
  Parts p;
  p.model = R"({"type":"WordPiece","unk_token":"[UNK]","continuing_subword_prefix":"##","max_input_chars_per_word":8,
               "vocab":{"[UNK]":0,"un":1,"##aff":2,"##able":3,"una":4,"##ff":5,"a":6}})";
  p.decoder = R"({"type":"WordPiece","prefix":"##","cleanup":true})";
  auto t = Tokenizer::from_json_string(p.json(), "wp");
  EXPECT_EQ(t->encode("unaffable", false), (std::vector<int32_t>{0}));  // 9 chars > 8
  p.model.replace(p.model.find("\"max_input_chars_per_word\":8"), 28, "\"max_input_chars_per_word\":100");
  t = Tokenizer::from_json_string(p.json(), "wp");
  EXPECT_EQ(t->encode("unaffable", false), (std::vector<int32_t>{4, 5, 3}));  // una ##ff ##able (longest first)
  EXPECT_EQ(t->encode("unax", false), (std::vector<int32_t>{0}));            // an unmatchable rest -> [UNK]
  EXPECT_EQ(t->decode({4, 5, 3, 6}, false), "unaffable a");
}

TEST(TokenizerErrors, RandomPrecompiledBlobsNeverReadOutOfBounds) {
  // Random tries (header consistent with the blob size) must load and normalize without
  // crashing: every trie step and replacement offset is bounds-checked.
  std::mt19937 rng(1234);
  static const char* kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int round = 0; round < 200; ++round) {
    size_t units = 1 + rng() % 64;
    std::string blob;
    uint32_t trie_bytes = static_cast<uint32_t>(units * 4);
    for (int k = 0; k < 4; ++k) blob.push_back(static_cast<char>((trie_bytes >> (8 * k)) & 0xFF));
    for (size_t k = 0; k < units * 4; ++k) blob.push_back(static_cast<char>(rng() & 0xFF));
    for (size_t k = 0, n = rng() % 16; k < n; ++k) blob.push_back(static_cast<char>('a' + rng() % 26));
    while (blob.size() % 3) blob.push_back('\0');
    std::string b64;
    for (size_t i = 0; i < blob.size(); i += 3) {
      uint32_t v = (static_cast<uint32_t>(static_cast<unsigned char>(blob[i])) << 16) |
                   (static_cast<uint32_t>(static_cast<unsigned char>(blob[i + 1])) << 8) | static_cast<unsigned char>(blob[i + 2]);
      for (int s = 18; s >= 0; s -= 6) b64.push_back(kB64[(v >> s) & 63]);
    }
    Parts p;
    p.normalizer = R"({"type":"Precompiled","precompiled_charsmap":")" + b64 + R"("})";
    std::shared_ptr<const Tokenizer> t;
    try {
      t = Tokenizer::from_json_string(p.json(), "random-charsmap");
    } catch (const moeserve::Error&) {
      continue;  // e.g. replacement strings that are not UTF-8
    }
    for (const char* s : {"abc", "a\xC3\xA9z", "\xE4\xB8\xAD\xE6\x96\x87", "\xF0\x9F\x98\x80 x", ""}) {
      try {
        t->encode(s, false);
      } catch (const moeserve::Error&) {
      }
    }
  }
}
