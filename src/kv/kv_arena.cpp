#include "kv/kv_arena.h"

#include <cstring>

#include "base/check.h"

namespace metro::kv {

size_t KvArena::block_bytes(const model::HParams& hp, const kernels::KvPageLayout& layout) {
  return layout.page_bytes() * 2 * hp.n_layer;
}

KvArena::KvArena(const model::HParams& hp, const kernels::KvPageLayout& layout, int32_t n_blocks) {
  view_.layout = layout;
  view_.n_layer = static_cast<int>(hp.n_layer);
  view_.n_blocks = n_blocks;
  arena_.resize(block_bytes(hp, layout) * static_cast<size_t>(n_blocks));
  view_.arena = arena_.data();
}

model::KvView KvArena::view(std::span<const std::span<const BlockId>> tables) const {
  model::KvView v = view_;
  v.tables.assign(tables.begin(), tables.end());
  return v;
}

void KvArena::copy_block(BlockId src, BlockId dst) {
  METRO_CHECK(src >= 0 && dst >= 0 && src < view_.n_blocks && dst < view_.n_blocks);
  const size_t bb = view_.block_bytes();
  std::memcpy(arena_.data() + static_cast<size_t>(dst) * bb,
              arena_.data() + static_cast<size_t>(src) * bb, bb);
}

double kv_bytes_per_element(kernels::DType type) {
  const auto& t = kernels::traits(type);
  return static_cast<double>(t.bytes_per_block) / t.block_size;
}

}  // namespace metro::kv
