// KV blocks released behind an attention window (kv::KvCacheConfig::window): a sequence
// holds about a window's blocks however long it grows; released entries read kNoBlock; a
// cached block stays in the prefix cache; free, fork and truncate skip the holes.
#include <gtest/gtest.h>

#include <numeric>

#include "kv/kv_cache_manager.h"

namespace metro::kv {
namespace {

std::vector<int32_t> tokens(int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), 100);
  return t;
}

KvCacheConfig windowed(int n_blocks, int bs, int window, int align, bool prefix_cache = true) {
  KvCacheConfig c{n_blocks, bs, prefix_cache, 7};
  c.window = window;
  c.window_read_align = align;
  return c;
}

// Grows one sequence a token at a time, committing each: what it holds never exceeds the
// blocks a query can read (window 20, reads aligned to 8, blocks of 4: the read start
// floor((n - 19) / 8) * 8 and everything after it, plus the block being filled).
TEST(KvWindow, ASequenceHoldsAWindowOfBlocksAsItGrows) {
  KvCacheManager kv(windowed(64, 4, 20, 8));
  const auto t = tokens(200);
  int most = 0;
  for (int n = 1; n <= 200; ++n) {
    ASSERT_TRUE(kv.allocate(1, 1).has_value()) << n;
    kv.commit(1, t, n);
    const auto table = kv.table(1);
    const int first_read = std::max(0, n - 19) / 8 * 8;
    int held = 0;
    for (size_t i = 0; i < table.size(); ++i) {
      const bool before = static_cast<int>(i + 1) * 4 <= first_read && i + 1 < table.size();
      EXPECT_EQ(table[i] == kNoBlock, before) << "n " << n << " block " << i;
      held += table[i] != kNoBlock;
    }
    EXPECT_EQ(kv.n_held(1), held);
    EXPECT_EQ(kv.stats().blocks_used, held);
    most = std::max(most, held);
  }
  EXPECT_LE(most, (20 + 8) / 4 + 1);
  EXPECT_EQ(kv.table(1).size(), 50u);  // the table still maps every position to its block
  kv.free(1);
  EXPECT_EQ(kv.stats().blocks_used, 0);
  EXPECT_EQ(kv.n_free_blocks(), 64);
}

// Released blocks that were published stay in the prefix cache: another prompt with the same
// start takes them back, as many as memory kept.
TEST(KvWindow, ReleasedPublishedBlocksStayCached) {
  KvCacheManager kv(windowed(32, 4, 8, 1));
  const auto t = tokens(40);
  ASSERT_TRUE(kv.allocate(1, 40).has_value());
  kv.commit(1, t, 40);
  EXPECT_LT(kv.n_held(1), 10);
  EXPECT_EQ(kv.stats().blocks_cached, 10);
  EXPECT_EQ(kv.computed_blocks(2, t), 36);  // every full block but the one holding the last token
  kv.free(1);
  kv.free(2);
  EXPECT_EQ(kv.stats().blocks_used, 0);
}

// Without the prefix cache (or once publishing stops) a released block is simply free; the
// chain ends at the first hole and is never extended past it.
TEST(KvWindow, UnpublishedBlocksAreFreedAndTheChainStops) {
  KvCacheManager plain(windowed(16, 4, 8, 1, false));
  ASSERT_TRUE(plain.allocate(1, 24).has_value());
  plain.commit(1, tokens(24), 24);
  EXPECT_EQ(plain.n_held(1), plain.stats().blocks_used);
  EXPECT_EQ(plain.n_free_blocks(), 16 - plain.n_held(1));

  KvCacheManager kv(windowed(16, 4, 8, 1));
  const auto t = tokens(40);
  ASSERT_TRUE(kv.allocate(1, 24).has_value());
  kv.stop_publishing(1);
  kv.commit(1, t, 24);
  EXPECT_EQ(kv.n_committed(1), 0);
  ASSERT_TRUE(kv.allocate(1, 16).has_value());
  kv.commit(1, t, 40);
  EXPECT_EQ(kv.n_committed(1), 0);
  EXPECT_EQ(kv.stats().blocks_cached, 0);
}

// A child forked past the window shares what its parent still holds and copies its partial
// block; freeing either leaves the other's blocks intact; a truncate of rejected drafts
// keeps the holes.
TEST(KvWindow, ForkAndTruncateKeepTheHoles) {
  KvCacheManager kv(windowed(32, 4, 8, 1));
  const auto t = tokens(64);
  ASSERT_TRUE(kv.allocate(1, 30).has_value());
  kv.commit(1, t, 30);
  const auto parent = std::vector<BlockId>(kv.table(1).begin(), kv.table(1).end());
  ASSERT_EQ(parent[0], kNoBlock);
  auto copy = kv.fork(1, 2, 30);
  ASSERT_TRUE(copy.has_value() && copy->has_value());
  const auto child = kv.table(2);
  ASSERT_EQ(child.size(), parent.size());
  for (size_t i = 0; i + 1 < child.size(); ++i) EXPECT_EQ(child[i], parent[i]) << i;
  EXPECT_NE(child.back(), parent.back());
  EXPECT_EQ(kv.n_held(2), kv.n_held(1));
  // Drafts reserved past the end, then rejected.
  ASSERT_TRUE(kv.allocate(2, 1, 8).has_value());
  kv.truncate(2, 31);
  EXPECT_EQ(kv.table(2)[0], kNoBlock);
  kv.commit(2, t, 31);
  kv.free(1);
  for (BlockId b : kv.table(2)) {
    if (b != kNoBlock) {
      EXPECT_GE(kv.pool().ref_count(b), 1);
    }
  }
  kv.free(2);
  EXPECT_EQ(kv.stats().blocks_used, 0);
}

// Without a window nothing is released, however long the sequence.
TEST(KvWindow, NoWindowReleasesNothing) {
  KvCacheManager kv(KvCacheConfig{64, 4, true, 7});
  const auto t = tokens(200);
  ASSERT_TRUE(kv.allocate(1, 200).has_value());
  kv.commit(1, t, 200);
  EXPECT_EQ(kv.n_held(1), 50);
  for (BlockId b : kv.table(1)) EXPECT_NE(b, kNoBlock);
}

}  // namespace
}  // namespace metro::kv
