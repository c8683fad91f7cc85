// Paged KV block accounting with reference counts and a prefix cache. Pure host code: it
// never touches a tensor; the executor owns the KV pool and reads block tables.
//
// Prefix cache identity. A full block of `block_size` tokens at index i of a sequence is
// identified by (identity of block i-1, its tokens). The chained hash
// H(parent hash, tokens) only indexes a bucket; a hit additionally requires an exact match
// of the tokens and of the parent's identity (a per-entry `content id`, unique for the
// life of the manager). Hash equality alone is never identity, so a colliding hash
// function costs speed, not correctness. Only full, computed blocks are cached.
//
// Free blocks: reference count 0. Uncached free blocks are handed out first; when none
// are left, the least recently used free cached block is evicted (removed from the cache)
// and reused. Blocks of one sequence are released tail first, so its longest prefixes are
// evicted before its shorter ones.
//
// Transactions: the scheduler plans a step against a `KvPlan` (a read-only view of the
// manager plus the step's pending operations and block budget) and only `apply(plan)`
// mutates the manager. A plan that is dropped leaves no trace. See KvPlan below.
#pragma once
#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace moeserve {

// Chained block hash: parent hash (0 for the first block) and the block's tokens.
using BlockHashFn = std::function<uint64_t(uint64_t parent, std::span<const int32_t> tokens)>;
uint64_t default_block_hash(uint64_t parent, std::span<const int32_t> tokens);

struct BlockManagerConfig {
  int num_blocks = 0;
  int block_size = 16;
  bool enable_prefix_caching = true;
  BlockHashFn hash_fn;  // empty: default_block_hash (tests inject colliding functions)
};

// A sequence's KV bookkeeping. Owned by the Sequence, mutated only by the BlockManager.
struct SeqBlocks {
  std::vector<int32_t> table;         // physical block ids; table[i] holds positions [i*bs, (i+1)*bs)
  std::vector<uint64_t> content_ids;  // identity of full block i (0: not known / not cached)
  std::vector<uint64_t> hashes;       // chained hash of full block i (same length as content_ids)
};

// The result of a prefix lookup: cached blocks covering tokens [0, num_tokens).
struct PrefixHit {
  std::vector<int32_t> blocks;
  std::vector<uint64_t> content_ids;
  std::vector<uint64_t> hashes;
  int num_tokens = 0;
};

class KvPlan;

class BlockManager {
 public:
  explicit BlockManager(BlockManagerConfig config);

  int block_size() const { return block_size_; }
  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  int num_free_blocks() const { return num_free_; }
  int num_used_blocks() const { return num_blocks() - num_free_; }
  double usage() const { return blocks_.empty() ? 0.0 : double(num_used_blocks()) / num_blocks(); }
  bool prefix_caching() const { return prefix_caching_; }
  int num_cached_blocks() const { return static_cast<int>(cached_count_); }
  int ref_count(int32_t block) const { return blocks_.at(block).ref; }
  bool is_cached(int32_t block) const { return blocks_.at(block).content_id != 0; }

  // Blocks needed to cover `num_tokens` positions.
  int blocks_for_tokens(int num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }

  // Longest cached prefix of `tokens` in whole blocks, at most `max_blocks` blocks. Const.
  // `root` is the identity (and hash) the first block chains from: 0 for every request, or a
  // request's cache salt (prefix_cache_root), so salted prompts only share with the same salt.
  PrefixHit lookup(std::span<const int32_t> tokens, int max_blocks, uint64_t root = 0) const;

  // Commits a plan (see KvPlan). Throws moeserve::Error if the plan is stale.
  void apply(KvPlan& plan);

  // Direct operations (each is a one-operation transaction; used by apply and by callers
  // outside the scheduling step, e.g. abort).
  void free(SeqBlocks& seq);  // releases every block, tail first; table becomes empty
  // Offers the full blocks among the first `num_computed` positions of `tokens` to the
  // prefix cache (call after the step that computed them). Idempotent.
  void cache_full_blocks(SeqBlocks& seq, std::span<const int32_t> tokens, int num_computed, uint64_t root = 0);
  // Shares the parent's full blocks covering at most `num_tokens` positions with `child`
  // (whose table must be empty). Returns the positions the child has in cache; the tail
  // past the last full block is not shared (no partial copy-on-write): the child
  // recomputes it. Never allocates, so it cannot fail.
  int fork(const SeqBlocks& parent, SeqBlocks& child, int num_tokens);
  // Keeps KV positions [0, new_len) and frees the blocks past them (speculative rejection).
  // Returns the number of positions still valid in cache (<= new_len): when the kept tail
  // block is shared with another sequence it is released too, because the caller will
  // overwrite its tail; the caller recomputes from the returned length.
  int truncate(SeqBlocks& seq, int new_len);

 private:
  friend class KvPlan;
  struct Block {
    int ref = 0;
    uint64_t content_id = 0;  // != 0 while in the prefix cache
    uint64_t parent_id = 0;
    uint64_t hash = 0;
    std::vector<int32_t> tokens;  // exact tokens while cached
    std::list<int32_t>::iterator lru_pos;
    bool in_lru = false;
  };

  void take(int32_t b);                 // ref++ (removing from the free pools if it was free)
  void release(int32_t b);              // ref--; at 0 into a free pool
  int32_t allocate_fresh();             // a block with ref 1 and no cache entry
  void uncache(int32_t b);              // drops the cache entry
  void grow(SeqBlocks& seq, int num_tokens);  // fresh blocks until the table covers num_tokens
  void take_prefix(SeqBlocks& seq, const PrefixHit& hit);
  uint64_t hash_block(uint64_t parent, std::span<const int32_t> tokens) const;
  // Finds a cached block equal to (parent_id, tokens) in bucket `hash`; -1 if none.
  int32_t find_cached(uint64_t hash, uint64_t parent_id, std::span<const int32_t> tokens) const;

  int block_size_;
  bool prefix_caching_;
  BlockHashFn hash_fn_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_uncached_;  // LIFO stack of free blocks without cache entries
  std::list<int32_t> lru_;              // free cached blocks, least recently freed first
  int num_free_ = 0;
  size_t cached_count_ = 0;
  uint64_t next_content_id_ = 1;
  uint64_t version_ = 0;  // bumped by every mutation; a plan must be applied to the version it saw
  std::unordered_multimap<uint64_t, int32_t> cache_;  // hash -> cached block
};

// A step's KV plan. Holds pending operations and the free-block budget they imply,
// without mutating the manager:
//   - free(seq): preemption; blocks whose planned ref count reaches 0 become budget.
//   - grow(seq, n, hit): cover positions [0, n) of seq, first with the prefix hit's
//     blocks (taking a free cached block consumes budget), then with fresh blocks.
// apply() replays frees, then prefix takes, then fresh allocations, so a fresh allocation
// can never evict a block that a take in the same plan relies on. Sequences referenced
// by the plan must outlive apply() and must not be changed between planning and apply.
class KvPlan {
 public:
  explicit KvPlan(const BlockManager& bm);
  void free(SeqBlocks& seq);
  // Returns false (recording nothing) when the budget cannot cover it.
  bool grow(SeqBlocks& seq, int num_tokens, const PrefixHit* hit = nullptr);
  int budget() const { return budget_; }
  bool empty() const { return ops_.empty(); }

 private:
  friend class BlockManager;
  struct Op {
    SeqBlocks* seq;
    bool is_free;
    int num_tokens;
    PrefixHit hit;
  };
  int planned_ref(int32_t b) const;

  const BlockManager* bm_;
  int budget_;
  uint64_t version_;
  std::unordered_map<int32_t, int> ref_delta_;
  std::vector<Op> ops_;
};

}  // namespace moeserve
