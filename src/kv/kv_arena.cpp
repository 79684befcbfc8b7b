#include "kv/kv_arena.h"

#include "backends/registry.h"
#include "base/check.h"

namespace metro::kv {

size_t KvArena::block_bytes(const model::HParams& hp, const kernels::KvPageLayout& layout) {
  return layout.page_bytes() * 2 * hp.n_layer;
}

KvArena::KvArena(const model::HParams& hp, const kernels::KvPageLayout& layout, int32_t n_blocks)
    : KvArena(backends::default_backend(), static_cast<int>(hp.n_layer), layout, n_blocks) {}

KvArena::KvArena(std::shared_ptr<backends::Backend> backend, int n_layer,
                 const kernels::KvPageLayout& layout, int32_t n_blocks)
    : backend_(std::move(backend)) {
  view_.layout = layout;
  view_.n_layer = n_layer;
  view_.n_blocks = n_blocks;
  buffer_ = backend_->alloc_buffer(view_.block_bytes() * static_cast<size_t>(n_blocks));
  view_.arena = buffer_->data();
}

model::KvView KvArena::view(std::span<const std::span<const BlockId>> tables) const {
  model::KvView v = view_;
  v.tables.assign(tables.begin(), tables.end());
  return v;
}

void KvArena::copy_block(BlockId src, BlockId dst) {
  METRO_CHECK(src >= 0 && dst >= 0 && src < view_.n_blocks && dst < view_.n_blocks);
  const size_t bb = view_.block_bytes();
  if (src == dst) return;
  backend_->copy_bytes(*buffer_, static_cast<size_t>(src) * bb, static_cast<size_t>(dst) * bb, bb);
}

void KvArena::read_block(BlockId b, std::span<uint8_t> dst) {
  const size_t bb = view_.block_bytes();
  METRO_CHECK(b >= 0 && b < view_.n_blocks && dst.size() == bb);
  backend_->read_bytes(*buffer_, static_cast<size_t>(b) * bb, dst);
}

void KvArena::write_block(BlockId b, std::span<const uint8_t> src) {
  const size_t bb = view_.block_bytes();
  METRO_CHECK(b >= 0 && b < view_.n_blocks && src.size() == bb);
  backend_->write_bytes(*buffer_, static_cast<size_t>(b) * bb, src);
}

double kv_bytes_per_element(kernels::DType type) {
  const auto& t = kernels::traits(type);
  return static_cast<double>(t.bytes_per_block) / t.block_size;
}

}  // namespace metro::kv
