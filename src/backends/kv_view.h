// A step's window onto KV memory, as a backend reads and writes it.
//
// KV memory is one arena of blocks in the backend's memory; a block holds
// `layout.block_size` token positions for every layer of the arena, K then V: block b,
// layer l, K page at
//   arena + b * block_bytes() + (2 l) * page_bytes,  V page right after it.
// Block-major storage keeps one block's memory contiguous, so freeing, copying or
// spilling a block touches one range. Each sequence slot has a block table: the block ids
// holding its positions 0.., in order. The layers and KV heads are those of one model
// shard (its arena holds nothing of the other shards). The kv layer owns the arena and the
// tables; the model and the backends only read and write through this view.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/attention.h"

namespace metro::backends {

struct KvView {
  kernels::KvPageLayout layout;
  int n_layer = 0;
  uint8_t* arena = nullptr;  // the address of the arena in the backend's memory
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

}  // namespace metro::backends
