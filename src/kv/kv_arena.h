// KvArena: the KV cache's memory. One allocation per engine in a backend's memory, carved
// into blocks laid out as backends::KvView describes (block-major; per layer a K page then
// a V page), for the layers and KV heads of one model shard.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backends/backend.h"
#include "kernels/attention.h"
#include "kv/block_pool.h"
#include "model/hparams.h"
#include "model/kv_view.h"

namespace metro::kv {

class KvArena {
 public:
  // Bytes one block takes for this model and layout.
  static size_t block_bytes(const model::HParams& hp, const kernels::KvPageLayout& layout);

  // Every layer of the model, in host memory (the default backend).
  KvArena(const model::HParams& hp, const kernels::KvPageLayout& layout, int32_t n_blocks);
  // n_layer layers (a shard's) with the layout's KV heads, in `backend`'s memory.
  KvArena(std::shared_ptr<backends::Backend> backend, int n_layer,
          const kernels::KvPageLayout& layout, int32_t n_blocks);

  int32_t n_blocks() const { return view_.n_blocks; }
  size_t bytes() const { return buffer_->bytes(); }
  const kernels::KvPageLayout& layout() const { return view_.layout; }

  // A view with these sequence tables (spans must outlive the view's use).
  model::KvView view(std::span<const std::span<const BlockId>> tables) const;
  model::KvView& scratch_view() { return view_; }
  // Copies block src's pages (every layer, K and V) over block dst's, on the backend.
  void copy_block(BlockId src, BlockId dst);
  size_t block_bytes() const { return view_.block_bytes(); }
  // Block b's pages (every layer, K and V) to or from host memory of block_bytes() bytes.
  void read_block(BlockId b, std::span<uint8_t> dst);
  void write_block(BlockId b, std::span<const uint8_t> src);

 private:
  std::shared_ptr<backends::Backend> backend_;
  std::unique_ptr<backends::DeviceBuffer> buffer_;
  model::KvView view_;
};

// KV memory F16 vs Q8_0 per element, for sizing.
double kv_bytes_per_element(kernels::DType type);

}  // namespace metro::kv
