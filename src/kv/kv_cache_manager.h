// KvCacheManager: the only door from the scheduler to KV memory.
//
//   computed_blocks(seq, tokens)  prefix-cache hits for a sequence that holds no blocks yet
//   allocate(seq, n_new_tokens)   room for the next n_new tokens, all or nothing
//   free(seq)                     gives every block back
// plus commit() to publish newly full blocks to the prefix cache after a step computed them,
// and fork() to let a sibling sample (n > 1) share a parent's prompt blocks.
//
// Full blocks are keyed by a chained hash of (parent hash, the block's tokens, model
// variant), so equal prefixes map to the same blocks whatever request computed them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "kv/prefix_hint.h"

namespace metro::kv {

using SeqId = uint64_t;

struct KvCacheConfig {
  int32_t n_blocks = 0;
  int block_size = 16;
  bool prefix_cache = true;
  uint64_t model_variant = 0;  // salts block hashes: different weights never share KV
};

struct KvCacheStats {
  int32_t blocks_total = 0;
  int32_t blocks_used = 0;     // referenced by some sequence
  int32_t blocks_cached = 0;   // hashed (some may be free and evictable)
  uint64_t prefix_queries = 0; // prompt tokens looked up
  uint64_t prefix_hits = 0;    // prompt tokens found
};

// A block copy the caller must perform on KV memory (fork of a partial block).
struct BlockCopy {
  BlockId src, dst;
};

class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheConfig& cfg);

  const KvCacheConfig& config() const { return cfg_; }
  int block_size() const { return cfg_.block_size; }

  // For a sequence without blocks: attaches the longest chain of cached full blocks that
  // match `tokens` and returns how many tokens they hold. The last token is never taken
  // from the cache (it must be computed to yield logits).
  int computed_blocks(SeqId seq, std::span<const int32_t> tokens);

  // Reserves slots for the next n_new tokens of `seq`. All or nothing: nullopt (and no
  // change) when the pool cannot supply the blocks. Returns the sequence's block table.
  std::optional<std::span<const BlockId>> allocate(SeqId seq, int n_new);

  // Publishes every full block among the first n_computed of `tokens` to the prefix cache.
  void commit(SeqId seq, std::span<const int32_t> tokens, int n_computed);

  // Returns all of seq's blocks to the pool (later blocks first, so a prefix outlives its
  // tail in the cache). Unknown ids are ignored.
  void free(SeqId seq);

  // Makes `child` share parent's blocks holding its first n_tokens: full blocks by
  // reference, a partial last block by copy (returned for the caller to perform on memory).
  // nullopt (no change) when no block is free for the copy.
  std::optional<std::optional<BlockCopy>> fork(SeqId parent, SeqId child, int n_tokens);

  std::span<const BlockId> table(SeqId seq) const;
  int n_slots(SeqId seq) const;  // tokens the sequence's blocks can hold so far
  bool has(SeqId seq) const { return seqs_.count(seq) != 0; }
  int32_t n_free_blocks() const { return pool_.n_free(); }
  // Blocks needed to hold n more tokens for seq (0 if they fit).
  int32_t blocks_needed(SeqId seq, int n_new) const;
  KvCacheStats stats() const;
  // A thread-safe mirror of the cached block hashes (null with the prefix cache off), for
  // estimates made off the engine thread.
  std::shared_ptr<const PrefixHint> prefix_hint() const { return hint_; }

  // The key of a full block: (model variant, parent block's key, the block's tokens).
  static uint64_t chain_hash(uint64_t variant, uint64_t parent, std::span<const int32_t> tokens);
  static uint64_t root_hash_of(uint64_t variant);  // the parent hash of a prompt's first block

 private:
  struct SeqBlocks {
    std::vector<BlockId> blocks;
    int n_tokens = 0;          // slots reserved
    int n_hashed = 0;          // leading blocks already committed to the cache
    uint64_t last_hash = 0;    // chained hash of block n_hashed - 1
  };
  uint64_t root_hash() const;
  uint64_t block_hash(uint64_t parent, std::span<const int32_t> tokens) const;

  KvCacheConfig cfg_;
  KvBlockPool pool_;
  std::shared_ptr<PrefixHint> hint_;
  std::unordered_map<SeqId, SeqBlocks> seqs_;
  uint64_t queries_ = 0, hits_ = 0;
};

}  // namespace metro::kv
