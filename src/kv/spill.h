// KvSpillTier: a tier below the KV arena that keeps the prefix cache's blocks after memory
// evicts them, and gives them back on a later hit (kv/file_spill.h keeps them in a file).
//
// The KV cache manager calls it on its own thread: on_evict() when the pool is about to
// reuse a cached block (the block's contents are still intact during the call), and
// restore() when a prompt's chain of full blocks misses memory, to fill a newly allocated
// block instead of computing it. A block is keyed as the prefix cache keys it: its chained
// hash, its parent's hash and its tokens; restore() checks all three.
#pragma once

#include <cstdint>
#include <span>

#include "kv/block_pool.h"

namespace metro::kv {

class KvSpillTier {
 public:
  virtual ~KvSpillTier() = default;
  // Block `b`, cached under this key, is about to be overwritten: keep its contents if the
  // tier can (it may drop them: full, failing, or behind).
  virtual void on_evict(BlockId b, uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) = 0;
  // Whether a block of this key is held and reading it back is expected to be cheaper than
  // computing its tokens at `position` (no I/O).
  virtual bool worth_restoring(uint64_t hash, int position) = 0;
  // Fills block `dst` with the contents kept under this key: false when none is kept, the
  // key differs, or the copy fails its checksum (then it is dropped and never used).
  virtual bool restore(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens, BlockId dst) = 0;
};

}  // namespace metro::kv
