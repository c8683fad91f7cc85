// The byte-level matcher and the token masks.
//
// A CompiledGrammar flattens the Grammar into positions (rule alternative, symbol index) and
// runs it as a pushdown automaton whose configuration is a SET of stacks (the grammar may be
// ambiguous). Stacks are persistent and hash-consed (a node = (position, parent node)), so a
// configuration is a sorted vector of node ids and equal configurations are equal vectors.
// Configurations are interned as "states" and byte transitions between states are memoised:
// what is built is a lazily constructed DFA over exactly the configurations that inputs
// reach, shared by every matcher of the grammar.
//
// Token masks in two parts (the idea xgrammar calls context-independent tokens, in our
// design). Each scan-ready node of a state is (byte position p, parent stack). Per class key
// = p plus the positions of its next kClassFrames stack frames (lazily, shared by every state
// and matcher of the grammar), the vocabulary trie is walked from those frames over a
// sentinel in place of the rest of the stack, which classifies each token as ACCEPTED (its
// bytes are consumed inside the frames: allowed whatever the rest of the stack), REJECTED (it
// dies inside the frames, and where the frames could end the next byte is not in FOLLOW of
// the bottom frame's rule) or UNCERTAIN (it leaves the frames: needs the real stack).
// Accepted sets are stored adaptively (token list, rejected list or bitset, whichever is
// smallest). A state's mask = OR of its nodes' accepted sets, then only the uncertain tokens
// run through the real automaton, in byte order so that consecutive tokens share the steps
// of their common prefix and a dead prefix skips its whole trie subtree. A class costs about
// one trie walk, as much as a state's plain walk, so it is built the second time its key is
// met (the first time the state's mask is a plain trie walk, pruned at dead bytes), or ahead
// of use by the background warm-up (start_warmup: the keys of the states near the start, off
// the sampling path, so a new grammar's first document finds most classes built). The
// finished mask is also cached per state (inside a JSON string or a repeated structure a
// mask is then a copy).
//
// Threads: a CompiledGrammar is shared between requests; its lazy tables are guarded by a
// mutex. A Matcher belongs to one sequence (the engine thread / one sampling task).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
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
    std::vector<int32_t> tok_ids;      // tokens in trie preorder ("rank" = index here)
    std::vector<int32_t> subtree_end;  // per node: first node after its subtree (preorder ids)
    std::vector<int32_t> parent;       // per node (root: -1)
    std::vector<int32_t> depth;        // per node: bytes from the root
    std::vector<int32_t> rank_node;    // per rank: the node the token ends at
    std::vector<uint32_t> rank_offset; // per rank + 1: the token's bytes in rank_bytes
    std::string rank_bytes;            // all trie tokens' bytes in rank order (a scan stays local)
  } trie;
  std::vector<uint32_t> trie_token_bits;  // mask_words(): the tokens in the trie
  uint64_t fingerprint = 0;  // hash of the contents (for the compile cache key)

  void build();  // fills trie and fingerprint; call after filling the fields above
  int32_t mask_words() const { return (mask_size + 31) / 32; }
};

// Decodes a byte-level BPE token string (GPT-2's bytes_to_unicode alphabet) to bytes;
// returns false when a character is outside that alphabet.
bool byte_level_decode(std::string_view token, std::string& out);

class CompiledGrammar {
 public:
  // Throws GrammarError when the grammar is left-recursive or matches no string at all.
  CompiledGrammar(const Grammar& g, std::shared_ptr<const TokenVocab> vocab);
  ~CompiledGrammar();
  CompiledGrammar(const CompiledGrammar&) = delete;
  CompiledGrammar& operator=(const CompiledGrammar&) = delete;
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
  // The same mask by the plain full walk of the trie (no per-position classes, no cache):
  // the reference the fast path is tested against.
  void fill_mask_reference(int32_t state, std::span<uint32_t> mask);
  // Lazily made tables, for tests and benchmarks.
  struct Stats {
    size_t states = 0, position_classes = 0, class_bytes = 0, cached_masks = 0;
    uint64_t uncertain_checked = 0;  // tokens run through the full automaton by fill_mask
  };
  Stats stats();
  // Class warm-up: builds the classes of the class keys of the states reachable from the
  // initial state, breadth first over byte transitions (the states a document meets first),
  // until `max_classes` are built, `max_states` visited, kWarmClassBytes of classes exist or
  // `budget_ms` spent. It takes the lock
  // for one class build or one state's expansion at a time and lets a waiting fill_mask go
  // first, so masks interleave with it. Masks are the same with or without it (a class is
  // the same whenever it is built). Returns the number of classes built.
  size_t warm_classes(size_t max_classes, size_t max_states, double budget_ms);
  // warm_classes(kWarmClasses, kWarmStates, kWarmBudgetMs) on a background thread (GrammarCache
  // starts it after compiling; the destructor stops and joins it). wait_warmup: until it ends.
  void start_warmup();
  void wait_warmup();
  // Bounds of the background warm-up: classes, states visited, class memory, wall time. (Many
  // classes are cheap: each alternative of a long enum has its own; the memory bound stops it.)
  static constexpr size_t kWarmClasses = 4096, kWarmStates = 16384;
  static constexpr size_t kWarmClassBytes = size_t(32) << 20;
  static constexpr double kWarmBudgetMs = 2000;

  // Drops the per-state mask cache (benchmarks: the cost of a mask of a state not seen yet,
  // with the per-position classes and the byte transitions already made).
  void clear_mask_cache();

  // Bounds on the lazy tables: beyond them masks are no longer cached (memory) / the
  // configuration space is refused (a pathological grammar: the request fails).
  static constexpr size_t kMaxCachedMasks = 4096;
  static constexpr size_t kMaxNodes = 8u << 20;
  // Beyond this much memory in per-position classes, new states' masks use the full walk.
  static constexpr size_t kMaxClassBytes = size_t(256) << 20;
  // Stack frames below a node that a class walk includes: small helper rules (one character,
  // one digit) would otherwise leave their frame after a byte and make most tokens uncertain.
  static constexpr int kClassFrames = 3;

 private:
  enum Kind : uint8_t { kBytes, kRule, kEnd };
  struct Pos {
    Kind kind;
    int32_t arg;  // byte set index (kBytes) or rule id (kRule)
  };
  static constexpr int32_t kCtx = -2;  // stack sentinel of a position class's walk
  struct State {
    std::vector<int32_t> nodes;  // scan-ready nodes (top position is a byte set), sorted
    bool accept = false;
    bool ctx = false;            // (class walks) a path returned to the kCtx sentinel
    ByteSet first;               // union of the nodes' byte sets
    int32_t mask_slot = -1;      // index into masks_ when cached
    // Dense byte transitions, made on the first step out of this state: -2 unknown, -1 dead.
    std::unique_ptr<int32_t[]> next;
  };
  // The context-independent classification of one byte position's tokens (see the top).
  struct PosClass {
    enum Kind : uint8_t { kList, kRejectedList, kBits } kind = kList;
    std::vector<int32_t> ids;     // kList: accepted ids; kRejectedList: rejected ids
    std::vector<uint32_t> bits;   // kBits: accepted bitset
    std::vector<int32_t> uncertain;  // trie ranks, ascending (byte order)
    size_t bytes() const { return ids.size() * 4 + bits.size() * 4 + uncertain.size() * 4 + sizeof(*this); }
  };
  struct VecHash {
    size_t operator()(const std::vector<int32_t>& v) const;
  };

  std::shared_ptr<const TokenVocab> vocab_;
  std::vector<Pos> pos_;
  std::vector<ByteSet> sets_;
  std::vector<std::vector<int32_t>> alt_starts_;  // per rule
  std::vector<int32_t> rule_of_pos_;
  std::vector<ByteSet> follow_;   // per rule: bytes that can follow a completion of it
  bool all_productive_ = true;    // every rule derives some string (completing a rule never dead-ends)
  bool root_productive_ = true;   // the root derives some string (else the constructor throws)
  int32_t root_ = 0;

  std::mutex mu_;
  std::vector<std::pair<int32_t, int32_t>> nodes_;  // (pos, parent)
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<State> states_;
  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> state_ids_[4];  // by accept + 2 ctx
  std::vector<uint32_t> seen_stamp_;  // per node: closure visit stamp (make_state)
  uint32_t stamp_ = 0;
  std::vector<std::vector<uint32_t>> masks_;
  int32_t initial_ = -1;
  std::unordered_map<std::vector<int32_t>, std::unique_ptr<PosClass>, VecHash> classes_;  // by class key
  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> key_uses_;  // keys without a class yet
  size_t class_bytes_ = 0;
  uint64_t uncertain_checked_ = 0;
  std::vector<int32_t> walk_states_;  // scratch of the uncertain walk (state per depth)
  std::atomic<int> mask_waiting_{0};   // fill_mask calls waiting for or holding mu_ (warm-up yields)
  std::atomic<bool> stop_warmup_{false};
  std::thread warmup_;

  int32_t node(int32_t pos, int32_t parent);
  int32_t make_state(std::vector<int32_t> seeds);  // closure of the seed nodes, interned
  int32_t step_locked(int32_t state, uint8_t byte);
  void compute_mask_full_locked(int32_t state, std::span<uint32_t> mask);  // trie walk
  void compute_mask_locked(int32_t state, std::span<uint32_t> mask);       // classes + uncertain
  // The distinct class keys of a state's nodes, sorted.
  std::vector<std::vector<int32_t>> class_keys_locked(int32_t state);
  // The class of a key (positions of a node and its first frames; see compute_mask_locked);
  // null when over kMaxClassBytes.
  const PosClass* position_class_locked(const std::vector<int32_t>& key);
  void analyse_rules(const Grammar& g);  // follow_, all_productive_
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
  void fill_mask_reference(std::span<uint32_t> mask);  // CompiledGrammar::fill_mask_reference
  void rollback(int num_tokens);
  bool terminated() const { return terminated_; }
  // Identifies the current position (tokens accepted, automaton state): a mask computed ahead
  // (engine/structured_sampling.h) is used only while this is unchanged.
  std::pair<size_t, int32_t> position() const { return {history_.size(), history_.back()}; }
  bool accepting();  // the text so far is a complete match
  int32_t mask_words() const { return g_->vocab().mask_words(); }
  const CompiledGrammar& grammar() const { return *g_; }

 private:
  std::shared_ptr<CompiledGrammar> g_;
  std::vector<int32_t> history_;  // state after each accepted token; front = initial
  bool terminated_ = false;
};

}  // namespace moeserve::structured
