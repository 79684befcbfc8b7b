#include "router/kv_index.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "base/msgpack.h"
#include "kv/kv_events.h"
#include "server/kv_events_publisher.h"

namespace metro::router {
namespace {

constexpr int kBs = 4;

std::vector<int32_t> iota_tokens(size_t n, int32_t first) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

kv::KvEvent stored(std::vector<uint64_t> hashes, std::optional<uint64_t> parent, std::vector<int32_t> tokens) {
  kv::KvEvent e;
  e.kind = kv::KvEvent::Kind::kStored;
  e.hashes = std::move(hashes);
  e.parent = parent;
  e.token_ids = std::move(tokens);
  return e;
}

kv::KvEvent removed(std::vector<uint64_t> hashes) {
  kv::KvEvent e;
  e.kind = kv::KvEvent::Kind::kRemoved;
  e.hashes = std::move(hashes);
  return e;
}

// Batches in both layouts, as `metro serve --kv-events` encodes them: the index follows
// stores (a chain continued from a parent stored earlier), removals and a clear, per
// replica, matched by tokens whatever the replica's own (salted) hashes are.
TEST(KvIndex, FollowsStoresRemovalsAndClearsInBothLayouts) {
  for (bool array_layout : {false, true}) {
    KvIndex idx(2);
    EXPECT_EQ(idx.block_size(), 0);
    const std::vector<int32_t> prompt = iota_tokens(5 * kBs + 2, 100);  // 5 whole blocks
    // Replica 0: blocks 0-1, then 2-3 chained on block 1, in two batches.
    auto b1 = server::encode_kv_event_batch(
        {stored({11, 12}, std::nullopt, {prompt.begin(), prompt.begin() + 2 * kBs})}, 1.0, kBs, array_layout);
    auto b2 = server::encode_kv_event_batch(
        {stored({13, 14}, 12, {prompt.begin() + 2 * kBs, prompt.begin() + 4 * kBs})}, 2.0, kBs, array_layout);
    ASSERT_TRUE(idx.apply(0, b1).ok());
    ASSERT_TRUE(idx.apply(0, b2).ok());
    // Replica 1: the same two blocks under other hashes (another salt), and a different third.
    std::vector<int32_t> other(prompt.begin(), prompt.begin() + 3 * kBs);
    other[2 * kBs] = 7;
    ASSERT_TRUE(idx.apply(1, server::encode_kv_event_batch({stored({91, 92, 93}, std::nullopt, other)}, 3.0, kBs,
                                                           array_layout))
                    .ok());
    EXPECT_EQ(idx.block_size(), kBs);
    EXPECT_EQ(idx.matched(0, prompt), 4u);
    EXPECT_EQ(idx.matched(1, prompt), 2u);
    EXPECT_EQ(idx.blocks(0), 4u);
    // A different first block matches nothing; a prompt shorter than a block neither.
    std::vector<int32_t> changed = prompt;
    changed[0] = 1;
    EXPECT_EQ(idx.matched(0, changed), 0u);
    EXPECT_EQ(idx.matched(0, std::vector<int32_t>(prompt.begin(), prompt.begin() + kBs - 1)), 0u);
    // Removing block 2 cuts replica 0's match there.
    ASSERT_TRUE(idx.apply(0, server::encode_kv_event_batch({removed({13})}, 4.0, kBs, array_layout)).ok());
    EXPECT_EQ(idx.matched(0, prompt), 2u);
    EXPECT_EQ(idx.blocks(0), 3u);
    // A chain whose parent was never seen cannot be placed: skipped, counted.
    ASSERT_TRUE(idx.apply(0, server::encode_kv_event_batch(
                                 {stored({15}, 999, {prompt.begin() + 4 * kBs, prompt.begin() + 5 * kBs})}, 5.0, kBs,
                                 array_layout))
                    .ok());
    EXPECT_EQ(idx.skipped(), 1u);
    EXPECT_EQ(idx.blocks(0), 3u);
    // Tokens that do not fill the event's blocks: skipped.
    ASSERT_TRUE(idx.apply(1, server::encode_kv_event_batch({stored({94}, 93, {1, 2, 3})}, 6.0, kBs, array_layout)).ok());
    EXPECT_EQ(idx.skipped(), 2u);
    // AllBlocksCleared empties that replica only.
    kv::KvEvent clear;
    clear.kind = kv::KvEvent::Kind::kAllCleared;
    ASSERT_TRUE(idx.apply(1, server::encode_kv_event_batch({clear}, 7.0, kBs, array_layout)).ok());
    EXPECT_EQ(idx.matched(1, prompt), 0u);
    EXPECT_EQ(idx.matched(0, prompt), 2u);
    idx.clear(0);
    EXPECT_EQ(idx.matched(0, prompt), 0u);
  }
}

// Two replica hashes with the same tokens (two tenants' salts) hold one key until both go.
TEST(KvIndex, OneKeyHeldByTwoHashesStaysUntilBothAreRemoved) {
  KvIndex idx(1);
  const std::vector<int32_t> t = iota_tokens(kBs, 5);
  ASSERT_TRUE(idx.apply(0, server::encode_kv_event_batch({stored({1}, std::nullopt, t), stored({2}, std::nullopt, t)},
                                                         0, kBs, false))
                  .ok());
  EXPECT_EQ(idx.matched(0, t), 1u);
  ASSERT_TRUE(idx.apply(0, server::encode_kv_event_batch({removed({1})}, 0, kBs, false)).ok());
  EXPECT_EQ(idx.matched(0, t), 1u);
  ASSERT_TRUE(idx.apply(0, server::encode_kv_event_batch({removed({2})}, 0, kBs, false)).ok());
  EXPECT_EQ(idx.matched(0, t), 0u);
}

TEST(KvIndex, RefusesBytesThatAreNotAnEventBatch) {
  KvIndex idx(1);
  EXPECT_FALSE(idx.apply(0, "not msgpack at all").ok());
  MsgpackWriter w;
  w.map(1);
  w.str("events");
  w.str("not an array");
  EXPECT_FALSE(idx.apply(0, w.bytes()).ok());
  EXPECT_FALSE(idx.apply(3, server::encode_kv_event_batch({}, 0, kBs, false)).ok());  // no such replica
  EXPECT_EQ(KvIndex::block_keys(iota_tokens(9, 0), kBs).size(), 2u);
}

}  // namespace
}  // namespace metro::router
