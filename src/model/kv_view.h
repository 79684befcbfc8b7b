// The model's window onto KV memory for one step.
//
// KV memory is one arena of blocks; a block holds `layout.block_size` token positions for
// every layer, K then V: block b, layer l, K page at
//   arena + b * block_bytes() + (2 l) * page_bytes,  V page right after it.
// Block-major storage keeps one block's memory contiguous, so freeing, copying or
// spilling a block touches one range. Each sequence slot has a block table: the block ids
// holding its positions 0.., in order. The kv layer (above the model) owns the arena and
// the tables; the model only reads and writes through this view.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/attention.h"

namespace metro::model {

struct KvView {
  kernels::KvPageLayout layout;
  int n_layer = 0;
  uint8_t* arena = nullptr;
  int32_t n_blocks = 0;
  std::vector<std::span<const int32_t>> tables;  // per sequence slot

  size_t page_bytes() const { return layout.page_bytes(); }
  size_t block_bytes() const { return page_bytes() * 2 * static_cast<size_t>(n_layer); }
  uint8_t* k_page(int32_t block, int layer) const {
    return arena + static_cast<size_t>(block) * block_bytes() +
           static_cast<size_t>(2 * layer) * page_bytes();
  }
  uint8_t* v_page(int32_t block, int layer) const { return k_page(block, layer) + page_bytes(); }
};

}  // namespace metro::model
