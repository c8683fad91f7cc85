// The byte-level matcher and the token masks.
//
// A CompiledGrammar flattens the Grammar into positions (rule alternative, symbol index) and
// runs it as a pushdown automaton whose configuration is a SET of stacks (the grammar may be
// ambiguous). Stacks are persistent and hash-consed (a node = (position, parent node)), so a
// configuration is a sorted vector of node ids and equal configurations are equal vectors.
// Configurations are interned as "states" and byte transitions between states are memoised:
// what is built is a lazily constructed DFA over exactly the configurations that inputs
// reach, shared by every matcher of the grammar. A token mask is a walk of the vocabulary's
// byte trie from the current state (subtrees pruned at the first dead byte, bytes outside the
// state's first-byte set skipped without a transition), and is itself cached per state, so
// inside a JSON string or a repeated structure a mask is a copy after the first time.
//
// Threads: a CompiledGrammar is shared between requests; its lazy tables are guarded by a
// mutex. A Matcher belongs to one sequence (the engine thread / one sampling task).
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "structured/grammar.h"

namespace moeserve::structured {

// The model's vocabulary as bytes: `token_bytes[id]` (byte-level BPE decoded), with special
// tokens marked. Special tokens are never produced by a grammar; `stop_ids` (EOS) are allowed
// exactly at accepting states. Ids >= token_bytes.size() up to `mask_size` (padding) are never
// allowed.
struct TokenVocab {
  std::vector<std::string> token_bytes;
  std::vector<bool> special;
  std::vector<int32_t> stop_ids;
  int32_t mask_size = 0;  // the model's vocab (logit row) size, >= token_bytes.size()

  // Byte trie over the non-special, non-empty tokens (CSR).
  struct Trie {
    std::vector<int32_t> child_begin;  // per node: [child_begin[n], child_begin[n + 1])
    std::vector<uint8_t> child_byte;   // per edge
    std::vector<int32_t> child_node;   // per edge
    std::vector<int32_t> tok_begin;    // per node: tokens ending here [tok_begin[n], tok_begin[n+1])
    std::vector<int32_t> tok_ids;
  } trie;
  uint64_t fingerprint = 0;  // hash of the contents (for the compile cache key)

  void build();  // fills trie and fingerprint; call after filling the fields above
  int32_t mask_words() const { return (mask_size + 31) / 32; }
};

// Decodes a byte-level BPE token string (GPT-2's bytes_to_unicode alphabet) to bytes;
// returns false when a character is outside that alphabet.
bool byte_level_decode(std::string_view token, std::string& out);

class CompiledGrammar {
 public:
  CompiledGrammar(const Grammar& g, std::shared_ptr<const TokenVocab> vocab);
  const TokenVocab& vocab() const { return *vocab_; }
  std::shared_ptr<const TokenVocab> vocab_ptr() const { return vocab_; }
  size_t memory_bytes() const;

  // All below lock the lazy tables.
  int32_t initial_state();
  int32_t step(int32_t state, uint8_t byte);  // -1: dead
  int32_t step_bytes(int32_t state, std::string_view bytes);
  bool accepting(int32_t state);
  bool has_continuation(int32_t state);  // some byte can follow
  // Fills `mask` (mask_words() uint32 words, bit i of word i/32 = token i allowed).
  void fill_mask(int32_t state, std::span<uint32_t> mask);

  // Bounds on the lazy tables: beyond them masks are no longer cached (memory) / the
  // configuration space is refused (a pathological grammar: the request fails).
  static constexpr size_t kMaxCachedMasks = 4096;
  static constexpr size_t kMaxNodes = 8u << 20;

 private:
  enum Kind : uint8_t { kBytes, kRule, kEnd };
  struct Pos {
    Kind kind;
    int32_t arg;  // byte set index (kBytes) or rule id (kRule)
  };
  struct State {
    std::vector<int32_t> nodes;  // scan-ready nodes (top position is a byte set), sorted
    bool accept = false;
    ByteSet first;               // union of the nodes' byte sets
    int32_t mask_slot = -1;      // index into masks_ when cached
    // Dense byte transitions, made on the first step out of this state: -2 unknown, -1 dead.
    std::unique_ptr<int32_t[]> next;
  };
  struct VecHash {
    size_t operator()(const std::vector<int32_t>& v) const;
  };

  std::shared_ptr<const TokenVocab> vocab_;
  std::vector<Pos> pos_;
  std::vector<ByteSet> sets_;
  std::vector<std::vector<int32_t>> alt_starts_;  // per rule
  int32_t root_ = 0;

  std::mutex mu_;
  std::vector<std::pair<int32_t, int32_t>> nodes_;  // (pos, parent)
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<State> states_;
  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> state_ids_[2];  // by accept flag
  std::vector<uint32_t> seen_stamp_;  // per node: closure visit stamp (make_state)
  uint32_t stamp_ = 0;
  std::vector<std::vector<uint32_t>> masks_;
  int32_t initial_ = -1;

  int32_t node(int32_t pos, int32_t parent);
  int32_t make_state(std::vector<int32_t> seeds);  // closure of the seed nodes, interned
  int32_t step_locked(int32_t state, uint8_t byte);
  void compute_mask_locked(int32_t state, std::span<uint32_t> mask);
};

// One sequence's position in a grammar. accept_token / rollback keep a history of states, so
// speculative decoding can check a draft (is_allowed) and roll back without recomputing.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<CompiledGrammar> g);
  // Advances by one token; false (state unchanged) when the grammar does not allow it.
  // A stop token at an accepting state terminates the matcher.
  bool accept_token(int32_t id);
  bool is_allowed(int32_t id);  // without advancing
  void fill_mask(std::span<uint32_t> mask);
  void rollback(int num_tokens);
  bool terminated() const { return terminated_; }
  bool accepting();  // the text so far is a complete match
  int32_t mask_words() const { return g_->vocab().mask_words(); }
  const CompiledGrammar& grammar() const { return *g_; }

 private:
  std::shared_ptr<CompiledGrammar> g_;
  std::vector<int32_t> history_;  // state after each accepted token; front = initial
  bool terminated_ = false;
};

}  // namespace moeserve::structured
