#include "kv/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <set>

namespace metro::kv {
namespace {

std::vector<int32_t> seq_tokens(int n, int32_t start = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

TEST(KvBlockPool, RefCountsAndFreeQueue) {
  KvBlockPool p(4, 16);
  EXPECT_EQ(p.n_free(), 4);
  auto a = p.allocate(), b = p.allocate();
  ASSERT_TRUE(a && b);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(p.n_used(), 2);
  p.ref(*a);
  p.unref(*a);
  EXPECT_EQ(p.ref_count(*a), 1);
  p.unref(*a);
  p.unref(*b);
  EXPECT_EQ(p.n_free(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(p.allocate().has_value());
  EXPECT_FALSE(p.allocate().has_value());
}

TEST(KvBlockPool, CachedBlocksAreEvictedLastAndLeastRecentlyFreedFirst) {
  KvBlockPool p(3, 2);
  const std::vector<int32_t> t1 = {1, 2}, t2 = {3, 4};
  BlockId a = *p.allocate(), b = *p.allocate(), c = *p.allocate();
  p.set_hash(a, 11, 0, t1);
  p.set_hash(b, 22, 0, t2);
  p.unref(a);  // cached, freed first
  p.unref(b);  // cached, freed second
  p.unref(c);  // not cached: reused first
  EXPECT_EQ(*p.allocate(), c);
  EXPECT_EQ(p.lookup(11, 0, t1), a);
  EXPECT_EQ(*p.allocate(), a);  // evicts a's hash
  EXPECT_FALSE(p.lookup(11, 0, t1).has_value());
  EXPECT_EQ(p.lookup(22, 0, t2), b);
}

TEST(KvBlockPool, LookupVerifiesTokensAndParent) {
  KvBlockPool p(1, 2);
  const std::vector<int32_t> t = {5, 6}, other = {5, 7};
  BlockId a = *p.allocate();
  p.set_hash(a, 99, 7, t);
  EXPECT_TRUE(p.lookup(99, 7, t).has_value());
  EXPECT_FALSE(p.lookup(99, 7, other).has_value());  // same hash, different tokens
  EXPECT_FALSE(p.lookup(99, 8, t).has_value());       // different parent
}

TEST(KvCacheManager, AllocateIsAllOrNothing) {
  KvCacheManager m({.n_blocks = 4, .block_size = 16});
  ASSERT_TRUE(m.allocate(1, 40).has_value());  // 3 blocks
  EXPECT_EQ(m.table(1).size(), 3u);
  EXPECT_FALSE(m.allocate(2, 17).has_value());  // needs 2, 1 free
  EXPECT_FALSE(m.has(2) && !m.table(2).empty());
  ASSERT_TRUE(m.allocate(1, 8).has_value());  // 48 slots: still 3 blocks
  EXPECT_EQ(m.table(1).size(), 3u);
  ASSERT_TRUE(m.allocate(1, 1).has_value());  // 49: a 4th block
  EXPECT_EQ(m.n_free_blocks(), 0);
  m.free(1);
  EXPECT_EQ(m.n_free_blocks(), 4);
  EXPECT_EQ(m.stats().blocks_used, 0);
}

TEST(KvCacheManager, PrefixHitsShareBlocksAndNeverCoverTheLastToken) {
  KvCacheManager m({.n_blocks = 16, .block_size = 16});
  auto a = seq_tokens(200);
  EXPECT_EQ(m.computed_blocks(1, a), 0);
  ASSERT_TRUE(m.allocate(1, 200));
  m.commit(1, a, 200);  // 12 full blocks published
  auto b = a;
  b.push_back(7);       // same 200-token prefix
  EXPECT_EQ(m.computed_blocks(2, b), 192);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(m.table(2)[static_cast<size_t>(i)], m.table(1)[static_cast<size_t>(i)]);
  // Exactly 192 tokens: the last full block would hold the last token, so only 176 hit.
  std::vector<int32_t> c(a.begin(), a.begin() + 192);
  EXPECT_EQ(m.computed_blocks(3, c), 176);
  // A different first token shares nothing (the hash chain starts differently).
  auto d = a;
  d[0] = 1;
  EXPECT_EQ(m.computed_blocks(4, d), 0);
  auto st = m.stats();
  EXPECT_EQ(st.prefix_hits, 192u + 176u);
}

TEST(KvCacheManager, FreedPrefixStaysCachedUntilMemoryIsNeeded) {
  KvCacheManager m({.n_blocks = 8, .block_size = 4});
  auto a = seq_tokens(17);
  m.computed_blocks(1, a);
  ASSERT_TRUE(m.allocate(1, 17));  // 5 blocks
  m.commit(1, a, 17);              // 4 full blocks hashed
  m.free(1);
  EXPECT_EQ(m.stats().blocks_used, 0);
  EXPECT_EQ(m.computed_blocks(2, a), 16);  // all four cached blocks come back
  m.free(2);
  // Filling memory evicts them (least recently freed first) instead of failing.
  ASSERT_TRUE(m.allocate(3, 32));
  EXPECT_EQ(m.stats().blocks_cached, 0);
  EXPECT_EQ(m.computed_blocks(4, a), 0);
}

// Pending holds (an admitted prompt the engine is about to compute) count only when asked
// for, stack, and end with their handles; the cache's own blocks are unaffected.
TEST(KvCacheManager, PrefixHintPendingHoldsCountUntilDropped) {
  KvCacheManager m({.n_blocks = 8, .block_size = 4, .model_variant = 7});
  auto hint = m.prefix_hint();
  auto a = seq_tokens(17);
  auto b = a;
  b[9] = 9999;  // differs in the third block: two blocks shared with a
  EXPECT_EQ(hint->cached_tokens(b, true), 0);
  auto hold1 = hint->hold_pending(a);
  EXPECT_EQ(hint->cached_tokens(b), 0) << "pending is not cached";
  EXPECT_EQ(hint->cached_tokens(b, true), 8);
  EXPECT_EQ(hint->cached_tokens(a, true), 16) << "the last token is never credited";
  EXPECT_EQ(hint->pending_size(), 4u);
  auto hold2 = hint->hold_pending(b);
  EXPECT_EQ(hint->pending_size(), 6u);  // b's last two blocks are its own
  hold1.reset();
  EXPECT_EQ(hint->cached_tokens(a, true), 8) << "b's hold still covers the shared blocks";
  // A committed block and a pending one chain: cached first block, pending second.
  m.computed_blocks(1, a);
  ASSERT_TRUE(m.allocate(1, 17));
  m.commit(1, a, 5);
  EXPECT_EQ(hint->cached_tokens(a), 4);
  EXPECT_EQ(hint->cached_tokens(a, true), 8);
  hold2.reset();
  EXPECT_EQ(hint->pending_size(), 0u);
  EXPECT_EQ(hint->cached_tokens(a, true), 4);
  EXPECT_EQ(hint->size(), 1u);
}

TEST(KvCacheManager, PrefixHintFollowsCommitsAndEvictions) {
  KvCacheManager m({.n_blocks = 8, .block_size = 4, .model_variant = 7});
  auto hint = m.prefix_hint();
  ASSERT_NE(hint, nullptr);
  auto a = seq_tokens(17);
  EXPECT_EQ(hint->cached_tokens(a), 0);
  m.computed_blocks(1, a);
  ASSERT_TRUE(m.allocate(1, 17));
  m.commit(1, a, 10);  // two full blocks computed so far
  EXPECT_EQ(hint->cached_tokens(a), 8);
  m.commit(1, a, 17);
  EXPECT_EQ(hint->cached_tokens(a), 16);
  EXPECT_EQ(hint->cached_tokens(std::span<const int32_t>(a).first(16)), 12) << "the last token is computed";
  auto b = a;
  b[5] = 9999;  // differs in the second block: only the first is shared
  EXPECT_EQ(hint->cached_tokens(b), 4);
  m.free(1);
  EXPECT_EQ(hint->cached_tokens(a), 16) << "freed blocks stay cached";
  ASSERT_TRUE(m.allocate(3, 32));  // evicts them
  EXPECT_EQ(hint->cached_tokens(a), 0);
  EXPECT_EQ(hint->size(), 0u);
}

TEST(KvCacheManager, ModelVariantSaltsHashes) {
  const std::vector<int32_t> t = {1, 2, 3, 4};
  EXPECT_NE(KvCacheManager::chain_hash(1, 0, t), KvCacheManager::chain_hash(2, 0, t));
  EXPECT_NE(KvCacheManager::chain_hash(1, 0, t), KvCacheManager::chain_hash(1, 5, t));
  EXPECT_EQ(KvCacheManager::chain_hash(1, 5, t), KvCacheManager::chain_hash(1, 5, t));
}

TEST(KvCacheManager, DisabledPrefixCacheNeverHits) {
  KvCacheManager m({.n_blocks = 8, .block_size = 4, .prefix_cache = false});
  auto a = seq_tokens(12);
  m.computed_blocks(1, a);
  ASSERT_TRUE(m.allocate(1, 12));
  m.commit(1, a, 12);
  EXPECT_EQ(m.computed_blocks(2, a), 0);
  EXPECT_EQ(m.prefix_hint(), nullptr);
}

TEST(KvCacheManager, ForkSharesFullBlocksAndCopiesThePartialOne) {
  KvCacheManager m({.n_blocks = 8, .block_size = 4});
  auto a = seq_tokens(10);
  m.computed_blocks(1, a);
  ASSERT_TRUE(m.allocate(1, 10));  // blocks for 10 tokens: 3
  auto r = m.fork(1, 2, 10);
  ASSERT_TRUE(r.has_value());
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->src, m.table(1)[2]);
  EXPECT_EQ((*r)->dst, m.table(2)[2]);
  EXPECT_EQ(m.table(2)[0], m.table(1)[0]);
  EXPECT_EQ(m.table(2)[1], m.table(1)[1]);
  EXPECT_NE(m.table(2)[2], m.table(1)[2]);
  EXPECT_EQ(m.n_slots(2), 10);
  EXPECT_EQ(m.stats().blocks_used, 4);
  m.free(1);
  EXPECT_EQ(m.stats().blocks_used, 3);  // the child keeps the shared blocks alive
  m.free(2);
  EXPECT_EQ(m.stats().blocks_used, 0);
}

TEST(KvCacheManager, RandomChurnLeavesNothingInUse) {
  KvCacheManager m({.n_blocks = 64, .block_size = 16});
  std::mt19937 rng(3);
  std::set<SeqId> live;
  std::vector<int32_t> shared = seq_tokens(64);
  for (SeqId id = 1; id < 3000; ++id) {
    if (!live.empty() && rng() % 3 == 0) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      m.free(*it);
      live.erase(it);
      continue;
    }
    std::vector<int32_t> toks(shared.begin(), shared.begin() + static_cast<long>(rng() % 64));
    for (int i = 0; i < static_cast<int>(rng() % 80); ++i) toks.push_back(static_cast<int32_t>(rng() % 50));
    if (toks.empty()) toks.push_back(1);
    const int hinted = m.prefix_hint()->cached_tokens(toks);
    const int cached = m.computed_blocks(id, toks);
    ASSERT_EQ(hinted, cached) << "the hint mirrors the cache exactly on one thread";
    auto ok = m.allocate(id, static_cast<int>(toks.size()) - cached);
    if (!ok) {
      m.free(id);
      continue;
    }
    m.commit(id, toks, static_cast<int>(toks.size()));
    live.insert(id);
  }
  for (SeqId id : live) m.free(id);
  EXPECT_EQ(m.stats().blocks_used, 0);
  EXPECT_EQ(m.n_free_blocks(), 64);
  EXPECT_EQ(m.prefix_hint()->size(), static_cast<size_t>(m.stats().blocks_cached));
}

}  // namespace
}  // namespace metro::kv
