// Token masks: a small multi-byte vocabulary checked against brute force (each token's bytes
// run through the grammar alone), EOS at accept states, specials never, rollback, the cache.
#include <gtest/gtest.h>

#include <random>

#include "structured/constraint.h"
#include "structured/json_schema.h"

using namespace moeserve::structured;

namespace {

std::shared_ptr<TokenVocab> random_vocab(uint32_t seed, int n) {
  auto v = std::make_shared<TokenVocab>();
  std::mt19937 rng(seed);
  const std::string alphabet = "{}[]\":, \n0123456789-.eabcnultrsfx\\";
  for (int b = 0; b < 256; ++b) v->token_bytes.push_back(std::string(1, char(b)));
  for (int i = 0; i < n; ++i) {
    int len = 2 + rng() % 5;
    std::string t;
    for (int k = 0; k < len; ++k) t.push_back(alphabet[rng() % alphabet.size()]);
    v->token_bytes.push_back(t);
  }
  v->token_bytes.push_back("<|eos|>");
  v->token_bytes.push_back("<|special|>");
  v->special.assign(v->token_bytes.size(), false);
  v->special[v->token_bytes.size() - 1] = v->special[v->token_bytes.size() - 2] = true;
  v->stop_ids = {static_cast<int32_t>(v->token_bytes.size() - 2)};
  v->mask_size = static_cast<int32_t>(v->token_bytes.size()) + 40;  // padded logit row
  v->build();
  return v;
}

bool bit(const std::vector<uint32_t>& m, int id) { return (m[id >> 5] >> (id & 31)) & 1; }

}  // namespace

TEST(Matcher, MaskEqualsBruteForceAlongADocument) {
  auto vocab = random_vocab(7, 3000);
  Grammar g = grammar_from_json_schema_text(R"({"type":"object","properties":{"name":{"type":"string"},
      "n":{"type":"array","items":{"type":"number"}}},"required":["name","n"]})");
  auto cg = std::make_shared<CompiledGrammar>(g, vocab);
  const std::string doc = R"({"name": "ab\"c", "n": [1, -2.5e3, 0]})";
  Matcher m(cg);
  std::vector<uint32_t> mask(vocab->mask_words());
  for (size_t i = 0; i <= doc.size(); ++i) {
    m.fill_mask(mask);
    int32_t st = cg->step_bytes(cg->initial_state(), doc.substr(0, i));
    ASSERT_GE(st, 0);
    for (int id = 0; id < vocab->mask_size; ++id) {
      bool expect = false;
      if (id < static_cast<int>(vocab->token_bytes.size()) && !vocab->special[id])
        expect = cg->step_bytes(st, vocab->token_bytes[id]) >= 0;
      if (id == vocab->stop_ids[0]) expect = cg->accepting(st);
      ASSERT_EQ(bit(mask, id), expect) << "prefix " << i << " token " << id;
      ASSERT_EQ(expect, m.is_allowed(id)) << "is_allowed disagrees at " << id;
    }
    if (i < doc.size()) {
      ASSERT_TRUE(m.accept_token(static_cast<unsigned char>(doc[i])));
    }
  }
  EXPECT_TRUE(m.accepting());
  EXPECT_TRUE(m.accept_token(vocab->stop_ids[0]));
  EXPECT_TRUE(m.terminated());
  m.rollback(3);
  EXPECT_FALSE(m.terminated());
  EXPECT_FALSE(m.accepting());
}

// Bounded numbers (json_numbers.h) through multi-byte tokens: the mask equals brute force at
// every prefix, so a token like "5," or ".25" is allowed exactly when its bytes stay in range.
TEST(Matcher, NumberRangeMaskEqualsBruteForce) {
  auto vocab = random_vocab(5, 3000);
  Grammar g = grammar_from_json_schema_text(R"({"type":"object","properties":{
      "p":{"type":"number","minimum":-2.5,"exclusiveMaximum":3.75},"q":{"type":"number","exclusiveMinimum":0},
      "r":{"const":"x","type":"string"}},"required":["p","q","r"]})");
  auto cg = std::make_shared<CompiledGrammar>(g, vocab);
  const std::string doc = R"({"p": -2.4999, "q": 0.0010, "r": "x"})";
  Matcher m(cg);
  std::vector<uint32_t> mask(vocab->mask_words());
  for (size_t i = 0; i <= doc.size(); ++i) {
    m.fill_mask(mask);
    int32_t st = cg->step_bytes(cg->initial_state(), doc.substr(0, i));
    ASSERT_GE(st, 0) << i;
    for (int id = 0; id < vocab->mask_size; ++id) {
      bool expect = false;
      if (id < static_cast<int>(vocab->token_bytes.size()) && !vocab->special[id])
        expect = cg->step_bytes(st, vocab->token_bytes[id]) >= 0;
      if (id == vocab->stop_ids[0]) expect = cg->accepting(st);
      ASSERT_EQ(bit(mask, id), expect) << "prefix " << i << " token " << id;
    }
    if (i < doc.size()) ASSERT_TRUE(m.accept_token(static_cast<unsigned char>(doc[i])));
  }
  EXPECT_TRUE(m.accepting());
  for (const char* bad : {R"({"p": 3.75, "q": 1, "r": "x"})", R"({"p": 0, "q": 0.000, "r": "x"})",
                          R"({"p": -2.51, "q": 1, "r": "x"})", R"({"p": 1e0, "q": 1, "r": "x"})"})
    EXPECT_LT(cg->step_bytes(cg->initial_state(), bad), 0) << bad;
}

TEST(Matcher, RejectsDisallowedTokensAndKeepsState) {
  auto vocab = random_vocab(1, 100);
  auto cg = std::make_shared<CompiledGrammar>(parse_ebnf(R"(root ::= "ab" "c"*)"), vocab);
  Matcher m(cg);
  EXPECT_FALSE(m.accept_token('b'));
  EXPECT_FALSE(m.accept_token(vocab->stop_ids[0]));  // not at an accept state yet
  EXPECT_FALSE(m.accept_token(static_cast<int32_t>(vocab->token_bytes.size() - 1)));  // special
  EXPECT_TRUE(m.accept_token('a'));
  EXPECT_TRUE(m.accept_token('b'));
  EXPECT_TRUE(m.accepting());
  EXPECT_TRUE(m.accept_token('c'));
}

TEST(GrammarCache, HitsByHashAndVocab) {
  auto v1 = random_vocab(1, 50), v2 = random_vocab(2, 50);
  GrammarCache cache(2);
  ConstraintSpec a{ConstraintKind::Regex, "[a-z]+", {}, true, "regex"};
  ConstraintSpec b{ConstraintKind::Regex, "[a-y]+", {}, true, "regex"};
  auto g1 = cache.get(a, v1);
  EXPECT_EQ(cache.get(a, v1), g1);
  EXPECT_NE(cache.get(a, v2), g1);
  cache.get(b, v1);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_THROW(cache.get(ConstraintSpec{ConstraintKind::Regex, "[", {}, true, "regex"}, v1), GrammarError);
}

// The fast mask (per-position classes + uncertain tokens through the real automaton) must
// equal the plain trie walk at every prefix of valid documents, for grammars whose rules end
// inside strings, nested calls, nullable tails, recursion and a regex; and it must have
// checked fewer tokens in full than the vocabulary holds (the classes did prune).
// The class warm-up (what GrammarCache starts after compiling) builds classes before any mask,
// and masks from a warmed grammar equal the plain trie walk, also with the warm-up running on
// its thread while the document is matched.
TEST(Matcher, WarmedClassesGiveTheSameMasks) {
  auto vocab = random_vocab(12, 6000);
  const Grammar g = grammar_from_json_schema_text(R"({"type":"object","properties":{"name":{"type":"string"},
      "tags":{"type":"array","items":{"enum":["red","green","blue"]}},"n":{"type":"integer"}},
      "required":["name","tags","n"]})");
  const std::string doc = R"({"name": "a\"b", "tags": ["red", "blue"], "n": -42})";
  for (int mode = 0; mode < 2; ++mode) {
    auto cg = std::make_shared<CompiledGrammar>(g, vocab);
    if (mode == 0) {
      EXPECT_GT(cg->warm_classes(64, 256, 60000), 0u);
      EXPECT_GT(cg->stats().position_classes, 0u);
      EXPECT_EQ(cg->stats().cached_masks, 0u);  // classes only, no mask made yet
    } else {
      cg->start_warmup();  // racing the matcher below
    }
    Matcher m(cg);
    std::vector<uint32_t> fast(vocab->mask_words()), ref(vocab->mask_words());
    for (size_t i = 0; i <= doc.size(); ++i) {
      m.fill_mask(fast);
      m.fill_mask_reference(ref);
      ASSERT_EQ(fast, ref) << "mode " << mode << " prefix " << i;
      if (i < doc.size()) ASSERT_TRUE(m.accept_token(static_cast<unsigned char>(doc[i])));
    }
    cg->wait_warmup();
  }
  // Stopped by its owner: destroying a grammar mid warm-up joins the thread.
  auto cg = std::make_shared<CompiledGrammar>(g, vocab);
  cg->start_warmup();
  cg.reset();
}

TEST(Matcher, FastMaskEqualsFullTrieWalk) {
  auto vocab = random_vocab(11, 6000);
  struct Case {
    Grammar g;
    std::string doc;
  };
  std::vector<Case> cases;
  cases.push_back({grammar_from_json_schema_text(R"({"type":"object","properties":{"name":{"type":"string"},
      "n":{"type":"array","items":{"type":"number"}}},"required":["name","n"]})"),
                   R"({"name": "ab\"c", "n": [1, -2.5e3, 0]})"});
  cases.push_back({grammar_from_json_schema_text(R"({"$defs":{"p":{"type":"object","properties":{
      "a":{"type":"integer"},"k":{"type":"array","items":{"$ref":"#/$defs/p"}}}}},"$ref":"#/$defs/p"})"),
                   R"({"a": 1, "k": [{"k": [{"a": 20}]}, {}]})"});
  cases.push_back({parse_ebnf(R"(root ::= "x" item* ("." | "") 
      item ::= "[" [a-z]+ "]" | "{" root "}")"),
                   "x[ab]{x[c].}[d]."});
  cases.push_back({grammar_from_choices({"alpha", "alpine", "beta", "be"}), "alpine"});
  cases.push_back({grammar_from_json_schema_text(R"({"type":"array","items":{"type":"number","minimum":-13.001,
      "exclusiveMaximum":120.5}})"), "[-13.0009, 0, 120.49999, -0.0, 7.5]"});
  for (auto& c : cases) {
    auto cg = std::make_shared<CompiledGrammar>(c.g, vocab);
    std::vector<uint32_t> fast(vocab->mask_words()), ref(vocab->mask_words());
    // Pass 1 builds classes for keys met twice; pass 2, with the per-state mask cache
    // dropped, makes every mask from the classes.
    for (int pass = 0; pass < 2; ++pass) {
      if (pass == 1) cg->clear_mask_cache();
      Matcher m(cg);
      for (size_t i = 0; i <= c.doc.size(); ++i) {
        m.fill_mask(fast);
        m.fill_mask_reference(ref);
        ASSERT_EQ(fast, ref) << "doc " << c.doc << " prefix " << i << " pass " << pass;
        if (i < c.doc.size()) {
          ASSERT_TRUE(m.accept_token(static_cast<unsigned char>(c.doc[i])));
        }
      }
    }
    auto s = cg->stats();
    EXPECT_GT(s.position_classes, 0u);
    EXPECT_LT(s.uncertain_checked, static_cast<uint64_t>(vocab->token_bytes.size()) * (c.doc.size() + 1));
  }
}
