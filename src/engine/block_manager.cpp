#include "engine/block_manager.h"

#include <algorithm>

#include "core/error.h"

namespace moeserve {

namespace {
inline uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}
}  // namespace

uint64_t default_block_hash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ULL);
  for (int32_t t : tokens) h = mix64(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x632be59bd9b4e019ULL));
  return h;
}

BlockManager::BlockManager(BlockManagerConfig config)
    : block_size_(config.block_size),
      prefix_caching_(config.enable_prefix_caching),
      hash_fn_(config.hash_fn ? std::move(config.hash_fn) : BlockHashFn(default_block_hash)) {
  MS_CHECK(config.block_size > 0, "BlockManager: block_size must be positive, got {}", config.block_size);
  MS_CHECK(config.num_blocks > 0, "BlockManager: num_blocks must be positive, got {}", config.num_blocks);
  blocks_.resize(config.num_blocks);
  // Stack of free blocks: block 0 on top, so allocation order is 0, 1, 2, ...
  free_uncached_.reserve(config.num_blocks);
  for (int b = config.num_blocks - 1; b >= 0; --b) free_uncached_.push_back(b);
  num_free_ = config.num_blocks;
}

uint64_t BlockManager::hash_block(uint64_t parent, std::span<const int32_t> tokens) const {
  return hash_fn_(parent, tokens);
}

int32_t BlockManager::find_cached(uint64_t hash, uint64_t parent_id, std::span<const int32_t> tokens) const {
  auto [lo, hi] = cache_.equal_range(hash);
  for (auto it = lo; it != hi; ++it) {
    const Block& blk = blocks_[it->second];
    if (blk.parent_id == parent_id && std::equal(blk.tokens.begin(), blk.tokens.end(), tokens.begin(), tokens.end()))
      return it->second;
  }
  return -1;
}

PrefixHit BlockManager::lookup(std::span<const int32_t> tokens, int max_blocks, uint64_t root) const {
  PrefixHit hit;
  if (!prefix_caching_) return hit;
  const int n = std::min<int>(max_blocks, static_cast<int>(tokens.size()) / block_size_);
  uint64_t parent_hash = root, parent_id = root;
  for (int i = 0; i < n; ++i) {
    auto blk_tokens = tokens.subspan(size_t(i) * block_size_, block_size_);
    uint64_t h = hash_block(parent_hash, blk_tokens);
    int32_t b = find_cached(h, parent_id, blk_tokens);
    if (b < 0) break;
    hit.blocks.push_back(b);
    hit.content_ids.push_back(blocks_[b].content_id);
    hit.hashes.push_back(h);
    parent_hash = h;
    parent_id = blocks_[b].content_id;
  }
  hit.num_tokens = static_cast<int>(hit.blocks.size()) * block_size_;
  return hit;
}

void BlockManager::take(int32_t b) {
  ++version_;
  Block& blk = blocks_[b];
  if (blk.ref == 0) {
    // Only cached blocks are taken by id while free (prefix hits); uncached free blocks
    // are handed out by allocate_fresh.
    MS_CHECK(blk.in_lru, "BlockManager: taking free block {} that is not cached", b);
    lru_.erase(blk.lru_pos);
    blk.in_lru = false;
    --num_free_;
  }
  ++blk.ref;
}

void BlockManager::release(int32_t b) {
  ++version_;
  Block& blk = blocks_[b];
  MS_CHECK(blk.ref > 0, "BlockManager: releasing free block {}", b);
  if (--blk.ref > 0) return;
  ++num_free_;
  if (blk.content_id != 0) {
    blk.lru_pos = lru_.insert(lru_.end(), b);
    blk.in_lru = true;
  } else {
    free_uncached_.push_back(b);
  }
}

void BlockManager::uncache(int32_t b) {
  Block& blk = blocks_[b];
  if (blk.content_id == 0) return;
  ++version_;
  auto [lo, hi] = cache_.equal_range(blk.hash);
  for (auto it = lo; it != hi; ++it) {
    if (it->second == b) {
      cache_.erase(it);
      break;
    }
  }
  blk.content_id = 0;
  blk.parent_id = 0;
  blk.tokens.clear();
  --cached_count_;
}

int32_t BlockManager::allocate_fresh() {
  ++version_;
  int32_t b;
  if (!free_uncached_.empty()) {
    b = free_uncached_.back();
    free_uncached_.pop_back();
  } else {
    MS_CHECK(!lru_.empty(), "BlockManager: out of KV blocks ({} in total)", num_blocks());
    b = lru_.front();  // least recently freed cached block: evict it
    lru_.pop_front();
    blocks_[b].in_lru = false;
    uncache(b);
  }
  --num_free_;
  blocks_[b].ref = 1;
  return b;
}

void BlockManager::grow(SeqBlocks& seq, int num_tokens) {
  const int need = blocks_for_tokens(num_tokens);
  while (static_cast<int>(seq.table.size()) < need) seq.table.push_back(allocate_fresh());
}

void BlockManager::take_prefix(SeqBlocks& seq, const PrefixHit& hit) {
  if (hit.blocks.empty()) return;
  MS_CHECK(seq.table.empty(), "BlockManager: prefix hit for a sequence that already has blocks");
  for (int32_t b : hit.blocks) {
    take(b);
    seq.table.push_back(b);
  }
  seq.content_ids = hit.content_ids;
  seq.hashes = hit.hashes;
}

void BlockManager::free(SeqBlocks& seq) {
  for (auto it = seq.table.rbegin(); it != seq.table.rend(); ++it) release(*it);
  seq.table.clear();
  seq.content_ids.clear();
  seq.hashes.clear();
}

void BlockManager::cache_full_blocks(SeqBlocks& seq, std::span<const int32_t> tokens, int num_computed,
                                     uint64_t root) {
  if (!prefix_caching_) return;
  const int full = std::min<int>({num_computed, static_cast<int>(tokens.size()),
                                  static_cast<int>(seq.table.size()) * block_size_}) /
                   block_size_;
  for (int i = static_cast<int>(seq.content_ids.size()); i < full; ++i) {
    auto blk_tokens = tokens.subspan(size_t(i) * block_size_, block_size_);
    const uint64_t parent_hash = i > 0 ? seq.hashes[i - 1] : root;
    const uint64_t parent_id = i > 0 ? seq.content_ids[i - 1] : root;
    const uint64_t h = hash_block(parent_hash, blk_tokens);
    seq.hashes.push_back(h);
    if (i > 0 && parent_id == 0) {  // parent not identifiable: neither is this block
      seq.content_ids.push_back(0);
      continue;
    }
    const int32_t b = seq.table[i];
    Block& blk = blocks_[b];
    if (blk.content_id != 0) {  // already cached (should have come with a prefix hit)
      seq.content_ids.push_back(blk.content_id);
      continue;
    }
    const int32_t existing = find_cached(h, parent_id, blk_tokens);
    if (existing >= 0) {  // computed twice concurrently: keep the first entry, ours stays private
      seq.content_ids.push_back(blocks_[existing].content_id);
      continue;
    }
    blk.content_id = next_content_id_++;
    blk.parent_id = parent_id;
    blk.hash = h;
    blk.tokens.assign(blk_tokens.begin(), blk_tokens.end());
    cache_.emplace(h, b);
    ++cached_count_;
    ++version_;
    seq.content_ids.push_back(blk.content_id);
  }
}

int BlockManager::fork(const SeqBlocks& parent, SeqBlocks& child, int num_tokens) {
  MS_CHECK(child.table.empty(), "BlockManager::fork: child already has blocks");
  const int n = std::min<int>(num_tokens / block_size_, static_cast<int>(parent.table.size()));
  for (int i = 0; i < n; ++i) {
    take(parent.table[i]);
    child.table.push_back(parent.table[i]);
  }
  const size_t known = std::min<size_t>(n, parent.content_ids.size());
  child.content_ids.assign(parent.content_ids.begin(), parent.content_ids.begin() + known);
  child.hashes.assign(parent.hashes.begin(), parent.hashes.begin() + known);
  return n * block_size_;
}

int BlockManager::truncate(SeqBlocks& seq, int new_len) {
  MS_CHECK(new_len >= 0, "BlockManager::truncate: negative length {}", new_len);
  int keep = std::min<int>(blocks_for_tokens(new_len), static_cast<int>(seq.table.size()));
  int valid = std::min(new_len, keep * block_size_);
  while (static_cast<int>(seq.table.size()) > keep) {
    release(seq.table.back());
    seq.table.pop_back();
  }
  if (keep > 0 && valid % block_size_ != 0) {
    const int32_t last = seq.table.back();
    if (blocks_[last].ref > 1) {  // shared: the caller may not overwrite its tail
      release(last);
      seq.table.pop_back();
      valid = (keep - 1) * block_size_;
    } else {
      uncache(last);  // its tail will be overwritten, so the cached content would be wrong
    }
  }
  const size_t full = valid / block_size_;
  if (seq.content_ids.size() > full) seq.content_ids.resize(full);
  if (seq.hashes.size() > full) seq.hashes.resize(full);
  return valid;
}

void BlockManager::apply(KvPlan& plan) {
  MS_CHECK(plan.bm_ == this, "BlockManager::apply: plan belongs to another manager");
  MS_CHECK(plan.version_ == version_, "BlockManager::apply: stale plan (the manager changed since planning)");
  for (auto& op : plan.ops_)
    if (op.is_free) free(*op.seq);
  for (auto& op : plan.ops_)
    if (!op.is_free) take_prefix(*op.seq, op.hit);
  for (auto& op : plan.ops_)
    if (!op.is_free) grow(*op.seq, op.num_tokens);
  plan.ops_.clear();
  plan.ref_delta_.clear();
  plan.version_ = version_;
  plan.budget_ = num_free_;
}

KvPlan::KvPlan(const BlockManager& bm)
    : bm_(&bm), budget_(bm.num_free_blocks()), version_(bm.version_) {}

int KvPlan::planned_ref(int32_t b) const {
  auto it = ref_delta_.find(b);
  return bm_->blocks_[b].ref + (it == ref_delta_.end() ? 0 : it->second);
}

void KvPlan::free(SeqBlocks& seq) {
  for (int32_t b : seq.table) {
    int& d = ref_delta_[b];
    --d;
    MS_CHECK(bm_->blocks_[b].ref + d >= 0, "KvPlan: block {} freed more often than taken", b);
    if (bm_->blocks_[b].ref + d == 0) ++budget_;
  }
  ops_.push_back(Op{&seq, true, 0, {}});
}

bool KvPlan::grow(SeqBlocks& seq, int num_tokens, const PrefixHit* hit) {
  const bool has_hit = hit && !hit->blocks.empty();
  MS_CHECK(!has_hit || seq.table.empty(), "KvPlan: prefix hit for a sequence that already has blocks");
  int cost = 0;
  if (has_hit)
    for (int32_t b : hit->blocks)
      if (planned_ref(b) == 0) ++cost;
  const int have = std::max<int>(static_cast<int>(seq.table.size()), has_hit ? static_cast<int>(hit->blocks.size()) : 0);
  cost += std::max(0, bm_->blocks_for_tokens(num_tokens) - have);
  if (cost > budget_) return false;
  budget_ -= cost;
  if (has_hit)
    for (int32_t b : hit->blocks) ++ref_delta_[b];
  ops_.push_back(Op{&seq, false, num_tokens, has_hit ? *hit : PrefixHit{}});
  return true;
}

}  // namespace moeserve
