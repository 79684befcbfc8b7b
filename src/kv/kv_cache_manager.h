// KvCacheManager: the only door from the scheduler to KV memory.
//
//   computed_blocks(seq, tokens)           prefix-cache hits for a sequence that holds no blocks yet
//   allocate(seq, n_new, n_lookahead)      room for the next n_new (+ draft) tokens, all or nothing
//   free(seq)                              gives every block back
// plus commit() to publish newly full blocks of accepted tokens to the prefix cache after a
// step computed them, truncate() to give back the slots of rejected draft tokens, and fork()
// to let a sibling sample (n > 1) share a parent's prompt blocks.
//
// Speculative decoding treats drafts as just more tokens: a step reserves slots for them
// with allocate(..., n_lookahead), computes them, commits only the accepted ones and
// truncates the sequence back to its accepted length. A sequence's slots therefore fall in
// two parts, front to back:
//
//   [0, n_committed)          full blocks committed to the prefix cache (or taken from it):
//                             possibly shared with other sequences, never written again,
//                             never truncated
//   [n_committed, n_slots)    the rest of the reserved slots (computed or not, accepted or
//                             draft); truncate() may give them back
//
// Slots a sequence has yet to write always lie in blocks it holds alone: fork() shares only
// full blocks and copies a partial one, and truncate() refuses to end inside a shared block.
//
// Full blocks are keyed by a chained hash of (parent hash, the block's tokens, model
// variant), so equal prefixes map to the same blocks whatever request computed them.
//
// With a window (every layer of the model attends to at most the last `window` positions),
// a sequence gives its leading blocks back as it advances: once no query it can still
// compute reads a block, commit() releases it (its table entry becomes kNoBlock; a cached
// block stays in the prefix cache for other prompts). A sequence then holds about a
// window's worth of blocks however long it grows.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "kv/prefix_hint.h"
#include "kv/spill.h"

namespace metro::kv {

using SeqId = uint64_t;

struct KvCacheConfig {
  int32_t n_blocks = 0;
  int block_size = 16;
  bool prefix_cache = true;
  uint64_t model_variant = 0;  // salts block hashes: different weights never share KV
  // Every layer's attention window in tokens (0: some layer reads every position, nothing
  // is released), and the alignment of the first key position attention reads for a query
  // (the kernels read whole chunks of keys from position 0 on: positions from
  // floor((q - window + 1) / window_read_align) * window_read_align are read).
  int window = 0;
  int window_read_align = 1;
};

struct KvCacheStats {
  int32_t blocks_total = 0;
  int32_t blocks_used = 0;     // referenced by some sequence
  int32_t blocks_cached = 0;   // hashed (some may be free and evictable)
  uint64_t prefix_queries = 0; // prompt tokens looked up
  uint64_t prefix_hits = 0;    // prompt tokens found (restored ones among them)
  uint64_t restored_tokens = 0;  // prompt tokens read back from the spill tier
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
  // from the cache (it must be computed to yield logits). `scope` salts the sequence's
  // chain (0: the model's global scope): blocks are shared only between sequences of the
  // same scope, and the blocks this sequence commits are published in it. A sequence that
  // must not look up (empty `tokens`) still gets its scope this way.
  int computed_blocks(SeqId seq, std::span<const int32_t> tokens, uint64_t scope = 0);

  // Reserves slots for the next n_new + n_lookahead tokens of `seq` (n_lookahead: draft
  // tokens a speculative step computes ahead of the accepted ones; the manager reserves
  // them exactly like new tokens, and truncate() gives back those that are rejected). All or
  // nothing: nullopt (and no change) when the pool cannot supply the blocks. Returns the
  // sequence's block table. Call only with n_new >= 0 and n_lookahead >= 0.
  std::optional<std::span<const BlockId>> allocate(SeqId seq, int n_new, int n_lookahead = 0);

  // Publishes every full block among the first n_committed of `tokens` to the prefix cache;
  // with a window, then releases the blocks no query from position n_committed on reads.
  // Call only with accepted tokens: `tokens` is the sequence's token ids (never a draft
  // that may still be rejected) and their KV is computed for the first n_committed; a
  // published block is shared by later prompts that match it and is never written again.
  // Precondition (checked): n_committed <= tokens.size() and n_committed <= n_slots(seq),
  // so no block is published whose slots the sequence has not reserved. Blocks already
  // committed are not hashed again, so `tokens` must keep their ids unchanged. Unknown ids
  // are ignored.
  void commit(SeqId seq, std::span<const int32_t> tokens, int n_committed);
  // The sequence's later blocks are not published (their contents no longer follow from the
  // tokens alone: e.g. computed in part with other weights); those already are stay. Unknown
  // ids are ignored.
  void stop_publishing(SeqId seq);

  // The sequence keeps KV slots for its first n_tokens only: whole blocks past them go back
  // to the pool (later blocks first). A partially filled last block stays in the table; its
  // slots from n_tokens on hold stale KV (rejected drafts) that the next tokens allocated
  // overwrite, which is why it must belong to this sequence alone.
  // Precondition (checked): seq is known; n_committed(seq) <= n_tokens <= n_slots(seq); and
  // when n_tokens ends inside a block, that block is held by no other sequence and is not
  // in the prefix cache (a shared or published block is never written again).
  void truncate(SeqId seq, int n_tokens);

  // Returns all of seq's blocks to the pool (later blocks first, so a prefix outlives its
  // tail in the cache). Unknown ids are ignored.
  void free(SeqId seq);

  // Makes `child` share parent's blocks holding its first n_tokens: full blocks by
  // reference, a partial last block by copy (returned for the caller to perform on memory).
  // The child inherits the parent's committed blocks among the shared ones, with their
  // chained hashes. nullopt (no change) when no block is free for the copy.
  std::optional<std::optional<BlockCopy>> fork(SeqId parent, SeqId child, int n_tokens);

  // The sequence's block table: entry i holds positions [i * block_size, (i + 1) * block_size);
  // released leading blocks (see the window above) are kNoBlock.
  std::span<const BlockId> table(SeqId seq) const;
  // Blocks the sequence holds (its table less the released entries): what freeing it returns.
  int n_held(SeqId seq) const;
  int n_slots(SeqId seq) const;  // tokens the sequence has reserved slots for
  // Leading tokens whose full blocks the sequence has committed (or took from the prefix
  // cache): truncate() never goes below it.
  int n_committed(SeqId seq) const;
  bool has(SeqId seq) const { return seqs_.count(seq) != 0; }
  int32_t n_free_blocks() const { return pool_.n_free(); }
  // Read-only view of the block pool (ref counts, cached flags), for invariant checks.
  const KvBlockPool& pool() const { return pool_; }
  // Blocks allocate(seq, n_new, n_lookahead) would take from the pool (0 if they fit).
  int32_t blocks_needed(SeqId seq, int n_new, int n_lookahead = 0) const;
  KvCacheStats stats() const;
  // A lower tier for evicted prefix-cache blocks (null: none; not owned, must outlive the
  // manager's use). computed_blocks() then also restores what it keeps.
  void set_spill(KvSpillTier* tier);
  // Logs the prefix cache's stored and removed blocks into `log` (null: none; not owned).
  void set_event_log(KvEventLog* log) { pool_.set_event_log(log); }
  // A thread-safe mirror of the cached block hashes (null with the prefix cache off), for
  // estimates made off the engine thread.
  std::shared_ptr<const PrefixHint> prefix_hint() const { return hint_; }

  // The key of a full block: (model variant, parent block's key, the block's tokens).
  static uint64_t chain_hash(uint64_t variant, uint64_t parent, std::span<const int32_t> tokens);
  // The parent hash of a prompt's first block in a scope (0: the global one).
  static uint64_t root_hash_of(uint64_t variant, uint64_t scope = 0);

 private:
  // blocks.size() == ceil(n_tokens / block_size) at all times.
  struct SeqBlocks {
    std::vector<BlockId> blocks;
    int n_tokens = 0;              // slots reserved
    // chain[i]: chained hash of blocks[i], for the leading blocks already committed; its
    // size is the number of committed blocks and its back() the parent of the next one.
    std::vector<uint64_t> chain;
    uint64_t root = 0;  // the parent of blocks[0] in the sequence's scope; 0: global
    bool publish = true;  // false after stop_publishing()
    size_t n_released = 0;  // leading entries of `blocks` given back (kNoBlock)
  };
  // With a window: gives back the blocks before those a query at position `next` reads.
  void release_behind(SeqBlocks& s, int next);
  uint64_t root_hash() const;
  uint64_t last_hash(const SeqBlocks& s) const {
    return !s.chain.empty() ? s.chain.back() : s.root != 0 ? s.root : root_hash();
  }
  uint64_t block_hash(uint64_t parent, std::span<const int32_t> tokens) const;

  KvCacheConfig cfg_;
  KvBlockPool pool_;
  std::shared_ptr<PrefixHint> hint_;
  std::unordered_map<SeqId, SeqBlocks> seqs_;
  uint64_t queries_ = 0, hits_ = 0, restored_ = 0;
  KvSpillTier* spill_ = nullptr;
};

}  // namespace metro::kv
