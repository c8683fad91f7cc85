#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"
#include "engine/block_manager.h"

namespace moeserve {
namespace {

std::vector<int32_t> iota_tokens(int n, int start = 0) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Allocates and "computes" `tokens` for a fresh sequence, caching its full blocks.
SeqBlocks fill(BlockManager& bm, const std::vector<int32_t>& tokens) {
  SeqBlocks s;
  KvPlan plan(bm);
  EXPECT_TRUE(plan.grow(s, static_cast<int>(tokens.size())));
  bm.apply(plan);
  bm.cache_full_blocks(s, tokens, static_cast<int>(tokens.size()));
  return s;
}

TEST(BlockManager, AllocateAndFreeRestoresPool) {
  BlockManager bm({.num_blocks = 8, .block_size = 4});
  SeqBlocks a, b;
  KvPlan plan(bm);
  ASSERT_TRUE(plan.grow(a, 10));  // 3 blocks
  ASSERT_TRUE(plan.grow(b, 4));   // 1 block
  EXPECT_EQ(plan.budget(), 4);
  EXPECT_EQ(bm.num_free_blocks(), 8) << "planning must not mutate";
  bm.apply(plan);
  EXPECT_EQ(a.table.size(), 3u);
  EXPECT_EQ(b.table.size(), 1u);
  EXPECT_EQ(bm.num_free_blocks(), 4);
  for (int32_t blk : a.table) EXPECT_EQ(bm.ref_count(blk), 1);
  bm.free(a);
  bm.free(b);
  EXPECT_EQ(bm.num_free_blocks(), 8);
  EXPECT_DOUBLE_EQ(bm.usage(), 0.0);
}

TEST(BlockManager, PlanIsAllOrNothing) {
  BlockManager bm({.num_blocks = 4, .block_size = 4});
  SeqBlocks a, b;
  KvPlan plan(bm);
  ASSERT_TRUE(plan.grow(a, 12));
  EXPECT_FALSE(plan.grow(b, 8)) << "needs 2 blocks, 1 left";
  EXPECT_TRUE(plan.grow(b, 4));
  EXPECT_EQ(plan.budget(), 0);
  {
    KvPlan dropped(bm);
    ASSERT_TRUE(dropped.grow(a, 4));
  }  // a dropped plan leaves nothing behind
  EXPECT_EQ(bm.num_free_blocks(), 4);
  EXPECT_TRUE(a.table.empty());
  bm.apply(plan);
  EXPECT_EQ(bm.num_free_blocks(), 0);
  EXPECT_EQ(a.table.size(), 3u);
}

TEST(BlockManager, StalePlanIsRejected) {
  BlockManager bm({.num_blocks = 4, .block_size = 4});
  SeqBlocks a, b;
  KvPlan plan(bm);
  ASSERT_TRUE(plan.grow(a, 4));
  SeqBlocks other = fill(bm, iota_tokens(4));  // mutates after planning
  EXPECT_THROW(bm.apply(plan), Error);
  bm.free(other);
}

TEST(BlockManager, PlannedFreeFundsGrowth) {
  BlockManager bm({.num_blocks = 4, .block_size = 4});
  SeqBlocks victim = fill(bm, iota_tokens(12));  // 3 blocks
  SeqBlocks s;
  KvPlan plan(bm);
  EXPECT_FALSE(plan.grow(s, 8));
  plan.free(victim);
  EXPECT_EQ(plan.budget(), 4);
  ASSERT_TRUE(plan.grow(s, 16));
  bm.apply(plan);
  EXPECT_TRUE(victim.table.empty());
  EXPECT_EQ(s.table.size(), 4u);
  EXPECT_EQ(bm.num_free_blocks(), 0);
}

// cache_salt: blocks cached under a root are found only under the same root.
TEST(BlockManager, SaltedRootsDoNotShare) {
  BlockManager bm({.num_blocks = 16, .block_size = 4});
  const auto toks = iota_tokens(9);
  const uint64_t salt_a = (uint64_t(1) << 63) | 12345, salt_b = (uint64_t(1) << 63) | 678;
  SeqBlocks a;
  KvPlan plan(bm);
  ASSERT_TRUE(plan.grow(a, 9));
  bm.apply(plan);
  bm.cache_full_blocks(a, toks, 9, salt_a);
  EXPECT_EQ(bm.num_cached_blocks(), 2);
  EXPECT_EQ(bm.lookup(toks, 100, salt_a).num_tokens, 8);
  EXPECT_EQ(bm.lookup(toks, 100).num_tokens, 0) << "an unsalted request must not see salted blocks";
  EXPECT_EQ(bm.lookup(toks, 100, salt_b).num_tokens, 0) << "nor one with another salt";
  SeqBlocks u = fill(bm, toks);  // unsalted: its own entries
  EXPECT_EQ(bm.num_cached_blocks(), 4);
  EXPECT_EQ(bm.lookup(toks, 100).num_tokens, 8);
  EXPECT_EQ(bm.lookup(toks, 100, salt_a).blocks, std::vector<int32_t>(a.table.begin(), a.table.begin() + 2));
}

TEST(BlockManager, PrefixHitReusesFullBlocksOnly) {
  BlockManager bm({.num_blocks = 16, .block_size = 4});
  auto toks = iota_tokens(10);  // blocks [0..3] [4..7], partial [8, 9]
  SeqBlocks a = fill(bm, toks);
  EXPECT_EQ(bm.num_cached_blocks(), 2);
  auto q = iota_tokens(10);
  q[9] = 99;
  PrefixHit hit = bm.lookup(q, 100);
  ASSERT_EQ(hit.num_tokens, 8);
  EXPECT_EQ(hit.blocks, std::vector<int32_t>(a.table.begin(), a.table.begin() + 2));
  EXPECT_EQ(bm.lookup(q, 1).num_tokens, 4) << "max_blocks caps the hit";
  q[5] = 77;
  EXPECT_EQ(bm.lookup(q, 100).num_tokens, 4) << "the chain stops at the first differing block";

  // Taking the hit shares the blocks (ref counts 2) while `a` still runs.
  SeqBlocks b;
  hit = bm.lookup(toks, 100);
  KvPlan plan(bm);
  ASSERT_TRUE(plan.grow(b, 10, &hit));
  EXPECT_EQ(plan.budget(), bm.num_free_blocks() - 1) << "only the partial tail block is new";
  bm.apply(plan);
  EXPECT_EQ(b.table[0], a.table[0]);
  EXPECT_EQ(b.table[1], a.table[1]);
  EXPECT_NE(b.table[2], a.table[2]);
  EXPECT_EQ(bm.ref_count(a.table[0]), 2);
  bm.free(a);
  EXPECT_EQ(bm.ref_count(b.table[0]), 1);
  bm.free(b);
  EXPECT_EQ(bm.num_free_blocks(), 16);
  // Freed cached blocks remain hits until evicted, and taking one consumes budget.
  hit = bm.lookup(toks, 100);
  EXPECT_EQ(hit.num_tokens, 8);
  SeqBlocks c;
  KvPlan plan2(bm);
  ASSERT_TRUE(plan2.grow(c, 10, &hit));
  EXPECT_EQ(plan2.budget(), 16 - 3);
  bm.apply(plan2);
  EXPECT_EQ(bm.num_free_blocks(), 13);
  bm.free(c);
}

TEST(BlockManager, DisabledPrefixCachingNeverHits) {
  BlockManager bm({.num_blocks = 8, .block_size = 4, .enable_prefix_caching = false});
  SeqBlocks a = fill(bm, iota_tokens(8));
  EXPECT_EQ(bm.num_cached_blocks(), 0);
  EXPECT_EQ(bm.lookup(iota_tokens(8), 100).num_tokens, 0);
  bm.free(a);
}

TEST(BlockManager, HashCollisionsAreGuardedByExactComparison) {
  // Every block hashes to the same bucket.
  BlockManager bm({.num_blocks = 32, .block_size = 4, .hash_fn = [](uint64_t, std::span<const int32_t>) {
                     return uint64_t{42};
                   }});
  SeqBlocks a = fill(bm, {1, 2, 3, 4, 5, 6, 7, 8});
  SeqBlocks c = fill(bm, {9, 9, 9, 9, 5, 6, 7, 8});  // same second block, different parent
  EXPECT_EQ(bm.num_cached_blocks(), 4);
  EXPECT_EQ(bm.lookup(std::vector<int32_t>{5, 6, 7, 8, 1}, 100).num_tokens, 0) << "tokens differ";
  PrefixHit h = bm.lookup(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 0}, 100);
  ASSERT_EQ(h.num_tokens, 8);
  EXPECT_EQ(h.blocks[0], a.table[0]);
  EXPECT_EQ(h.blocks[1], a.table[1]) << "must not pick the block with the same tokens but another parent";
  PrefixHit h2 = bm.lookup(std::vector<int32_t>{9, 9, 9, 9, 5, 6, 7, 8, 0}, 100);
  ASSERT_EQ(h2.num_tokens, 8);
  EXPECT_EQ(h2.blocks[1], c.table[1]);
  EXPECT_EQ(bm.lookup(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 9, 0}, 100).num_tokens, 4);
  bm.free(a);
  bm.free(c);
}

TEST(BlockManager, EvictsLeastRecentlyFreedTailFirst) {
  BlockManager bm({.num_blocks = 6, .block_size = 2});
  SeqBlocks a = fill(bm, {1, 2, 3, 4, 5, 6});  // 3 cached blocks
  SeqBlocks b = fill(bm, {7, 8, 9, 10});       // 2 cached blocks
  const auto a_tab = a.table, b_tab = b.table;
  bm.free(a);  // a freed first: evicted first, tail block before head
  bm.free(b);
  EXPECT_EQ(bm.num_free_blocks(), 6);
  // One uncached block is left; it goes first, then the LRU cached ones.
  std::vector<int32_t> order;
  SeqBlocks x;
  for (int n = 1; n <= 6; ++n) {
    KvPlan p(bm);
    ASSERT_TRUE(p.grow(x, 2 * n));
    bm.apply(p);
    order.push_back(x.table.back());
  }
  std::vector<int32_t> expect = {order[0], a_tab[2], a_tab[1], a_tab[0], b_tab[1], b_tab[0]};
  EXPECT_EQ(order, expect);
  EXPECT_EQ(bm.num_cached_blocks(), 0);
  bm.free(x);
}

TEST(BlockManager, EvictionKeepsRecentlyUsedPrefix) {
  BlockManager bm({.num_blocks = 4, .block_size = 2});
  SeqBlocks a = fill(bm, {1, 2, 3, 4});
  SeqBlocks b = fill(bm, {5, 6, 7, 8});
  bm.free(a);
  bm.free(b);
  SeqBlocks x;  // needs 2 blocks: evicts a's (older) blocks, keeps b's
  KvPlan p(bm);
  ASSERT_TRUE(p.grow(x, 4));
  bm.apply(p);
  EXPECT_EQ(bm.lookup(std::vector<int32_t>{1, 2, 3, 4, 0}, 10).num_tokens, 0);
  EXPECT_EQ(bm.lookup(std::vector<int32_t>{5, 6, 7, 8, 0}, 10).num_tokens, 4);
  bm.free(x);
}

TEST(BlockManager, ForkSharesFullBlocksOnly) {
  BlockManager bm({.num_blocks = 8, .block_size = 4});
  auto toks = iota_tokens(10);
  SeqBlocks parent = fill(bm, toks);
  SeqBlocks child;
  EXPECT_EQ(bm.fork(parent, child, 10), 8);
  ASSERT_EQ(child.table.size(), 2u);
  EXPECT_EQ(bm.ref_count(parent.table[0]), 2);
  EXPECT_EQ(bm.ref_count(parent.table[2]), 1) << "the partial tail is not shared";
  bm.free(parent);
  EXPECT_EQ(bm.ref_count(child.table[0]), 1);
  EXPECT_EQ(bm.num_free_blocks(), 6);
  bm.free(child);
  EXPECT_EQ(bm.num_free_blocks(), 8);
}

TEST(BlockManager, TruncateFreesTailAndUncachesPartialBlock) {
  BlockManager bm({.num_blocks = 8, .block_size = 4});
  auto toks = iota_tokens(12);
  SeqBlocks s = fill(bm, toks);
  EXPECT_EQ(bm.num_cached_blocks(), 3);
  const int32_t second = s.table[1];
  EXPECT_EQ(bm.truncate(s, 6), 6);
  EXPECT_EQ(s.table.size(), 2u);
  EXPECT_EQ(bm.num_free_blocks(), 6);
  EXPECT_FALSE(bm.is_cached(second)) << "its tail will be overwritten";
  EXPECT_EQ(s.content_ids.size(), 1u);
  EXPECT_EQ(bm.lookup(toks, 10).num_tokens, 4);
  bm.free(s);
}

TEST(BlockManager, TruncateIntoSharedBlockReleasesIt) {
  BlockManager bm({.num_blocks = 8, .block_size = 4});
  SeqBlocks parent = fill(bm, iota_tokens(8));
  SeqBlocks child;
  ASSERT_EQ(bm.fork(parent, child, 8), 8);
  EXPECT_EQ(bm.truncate(child, 6), 4) << "the shared block must not be written: recompute from 4";
  EXPECT_EQ(child.table.size(), 1u);
  EXPECT_EQ(bm.ref_count(parent.table[1]), 1);
  EXPECT_TRUE(bm.is_cached(parent.table[1]));
  bm.free(child);
  bm.free(parent);
  EXPECT_EQ(bm.num_free_blocks(), 8);
}

TEST(BlockManager, DuplicateComputationKeepsChainIdentity) {
  BlockManager bm({.num_blocks = 16, .block_size = 2});
  // Two sequences compute the same first block concurrently; the second's copy is not
  // cached, but its own later block still chains onto the cached identity.
  SeqBlocks a = fill(bm, {1, 2});
  SeqBlocks b;
  KvPlan p(bm);
  ASSERT_TRUE(p.grow(b, 4));
  bm.apply(p);
  bm.cache_full_blocks(b, std::vector<int32_t>{1, 2, 3, 4}, 4);
  EXPECT_FALSE(bm.is_cached(b.table[0]));
  EXPECT_TRUE(bm.is_cached(b.table[1]));
  PrefixHit h = bm.lookup(std::vector<int32_t>{1, 2, 3, 4, 5}, 10);
  ASSERT_EQ(h.num_tokens, 4);
  EXPECT_EQ(h.blocks[0], a.table[0]);
  EXPECT_EQ(h.blocks[1], b.table[1]);
  bm.free(a);
  bm.free(b);
}

}  // namespace
}  // namespace moeserve
