// The KV arena's memory and block copies go through its backend: a shard's arena holds
// its layers and KV heads only, and copy_block copies one whole block (every layer's K and
// V pages) and nothing else.
#include <gtest/gtest.h>

#include <vector>

#include "backends/registry.h"
#include "kv/kv_arena.h"

namespace metro::kv {
namespace {

TEST(KvArena, AShardsArenaHoldsItsLayersAndHeads) {
  kernels::KvPageLayout layout{kernels::DType::kF16, 16, 1, 64};
  KvArena arena(backends::default_backend(), 3, layout, 10);
  EXPECT_EQ(arena.scratch_view().n_layer, 3);
  EXPECT_EQ(arena.bytes(), layout.page_bytes() * 2 * 3 * 10);
}

TEST(KvArena, CopyBlockCopiesOneWholeBlockOnTheBackend) {
  kernels::KvPageLayout layout{kernels::DType::kQ8_0, 5, 2, 32};
  KvArena arena(backends::default_backend(), 2, layout, 4);  // host memory: written directly
  const size_t bb = arena.scratch_view().block_bytes();
  uint8_t* base = arena.scratch_view().arena;
  for (size_t i = 0; i < arena.bytes(); ++i) base[i] = static_cast<uint8_t>(i * 7 + i / bb);
  const std::vector<uint8_t> before(base, base + arena.bytes());
  arena.copy_block(3, 1);
  for (size_t i = 0; i < arena.bytes(); ++i) {
    const size_t block = i / bb;
    const uint8_t want = block == 1 ? before[3 * bb + i % bb] : before[i];
    ASSERT_EQ(base[i], want) << "byte " << i % bb << " of block " << block;
  }
}

}  // namespace
}  // namespace metro::kv
