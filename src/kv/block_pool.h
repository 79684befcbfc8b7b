// KvBlockPool: reference-counted KV blocks, a free queue in eviction order, and the prefix
// cache's hash -> block map.
//
// A block is free when nobody references it. Free blocks that hold a full, hashed block of
// tokens stay findable by their hash ("cached") until the pool hands them out again, so
// memory that is not needed keeps serving prefix hits; eviction is lazy and happens only on
// allocation, least recently freed first (the head of the free queue).
//
// Pure bookkeeping: the pool knows block ids, not memory (tests need no arena).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace metro::kv {

class KvEventLog;
class PrefixHint;

using BlockId = int32_t;
inline constexpr BlockId kNoBlock = -1;

class KvBlockPool {
 public:
  KvBlockPool(int32_t n_blocks, int block_size);

  int32_t n_blocks() const { return static_cast<int32_t>(ref_.size()); }
  int block_size() const { return block_size_; }
  int32_t n_free() const { return n_free_; }             // includes cached, unreferenced blocks
  int32_t n_used() const { return n_blocks() - n_free_; }
  int32_t n_cached() const { return static_cast<int32_t>(by_hash_.size()); }

  // Takes the block at the head of the free queue (evicting its cached hash), ref = 1.
  std::optional<BlockId> allocate();
  // Adds a reference; a free cached block leaves the free queue (a prefix-cache hit).
  void ref(BlockId b);
  // Drops a reference; at zero the block joins the tail of the free queue.
  void unref(BlockId b);
  int ref_count(BlockId b) const { return ref_[static_cast<size_t>(b)]; }

  // Prefix cache. A block's key is a chained hash plus, to make hits exact, its parent's
  // hash and its tokens (compared on lookup, so a 64-bit collision cannot alias memory).
  std::optional<BlockId> lookup(uint64_t hash, uint64_t parent_hash,
                                std::span<const int32_t> tokens) const;
  // Registers a full block under `hash` (no-op if the block or hash is already registered).
  void set_hash(BlockId b, uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens);
  bool is_cached(BlockId b) const { return has_hash_[static_cast<size_t>(b)]; }
  // Mirrors every registered and dropped hash into `hint` (null: none). Not owned.
  void set_hint(PrefixHint* hint) { hint_ = hint; }
  // Logs every registered and dropped hash into `log` (null: none). Not owned.
  void set_event_log(KvEventLog* log) { events_ = log; }
  // Called by allocate() with a cached block it is about to hand out (its contents still
  // intact) and the block's key: a lower tier may keep them. Null: none.
  using EvictFn = std::function<void(BlockId, uint64_t hash, uint64_t parent, std::span<const int32_t> tokens)>;
  void set_on_evict(EvictFn fn) { on_evict_ = std::move(fn); }

 private:
  void push_free_tail(BlockId b);
  void remove_free(BlockId b);
  void drop_hash(BlockId b);

  int block_size_;
  std::vector<int32_t> ref_;
  // Free queue as an intrusive doubly linked list over block ids.
  std::vector<BlockId> prev_, next_;
  std::vector<uint8_t> in_free_;
  BlockId head_ = kNoBlock, tail_ = kNoBlock;
  int32_t n_free_ = 0;
  // Prefix-cache keys of hashed blocks.
  std::vector<uint8_t> has_hash_;
  std::vector<uint64_t> hash_, parent_hash_;
  std::vector<int32_t> tokens_;  // [n_blocks][block_size]
  std::unordered_map<uint64_t, BlockId> by_hash_;
  PrefixHint* hint_ = nullptr;
  KvEventLog* events_ = nullptr;
  EvictFn on_evict_;
};

}  // namespace metro::kv
