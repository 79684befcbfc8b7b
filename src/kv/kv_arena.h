// KvArena: the KV cache's memory. One allocation per engine, carved into blocks laid out as
// model::KvView describes (block-major; per layer a K page then a V page).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/aligned.h"
#include "kernels/attention.h"
#include "kv/block_pool.h"
#include "model/hparams.h"
#include "model/kv_view.h"

namespace metro::kv {

class KvArena {
 public:
  // Bytes one block takes for this model and layout.
  static size_t block_bytes(const model::HParams& hp, const kernels::KvPageLayout& layout);

  KvArena(const model::HParams& hp, const kernels::KvPageLayout& layout, int32_t n_blocks);

  int32_t n_blocks() const { return view_.n_blocks; }
  size_t bytes() const { return arena_.size(); }
  const kernels::KvPageLayout& layout() const { return view_.layout; }

  // A view with these sequence tables (spans must outlive the view's use).
  model::KvView view(std::span<const std::span<const BlockId>> tables) const;
  model::KvView& scratch_view() { return view_; }
  void copy_block(BlockId src, BlockId dst);

 private:
  AlignedBuffer<uint8_t> arena_;
  model::KvView view_;
};

// KV memory F16 vs Q8_0 per element, for sizing.
double kv_bytes_per_element(kernels::DType type);

}  // namespace metro::kv
