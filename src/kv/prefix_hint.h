// PrefixHint: a thread-safe mirror of the prefix cache's block hashes, so that threads other
// than the engine's (the gateway deciding admission) can estimate how much of a prompt the
// cache would serve without touching the cache itself.
//
// The engine thread keeps it current (KvBlockPool reports every hash it registers and
// drops); a lookup hashes the prompt's full blocks the way KvCacheManager does and counts
// the leading ones present. It is an estimate: a block may be evicted between the lookup
// and the request's first step, and hashes are compared without the cache's token check.
//
// With a spill tier (kv/file_spill.h) it also mirrors the blocks the tier holds after memory
// evicted them (set_spilled): a hit there is read back, not computed, so admission may count
// it as cached.
//
// It also holds *pending* blocks: the prompts of requests admitted but not yet started
// (hold_pending), whose prefixes the engine is about to compute and cache, so that requests
// arriving behind them in a burst that shares a system prompt can be credited with it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace metro::kv {

class PrefixHint;

// A prompt's full blocks held as pending in a PrefixHint; released when destroyed.
class PendingPrefix {
 public:
  PendingPrefix(std::shared_ptr<const PrefixHint> hint, std::vector<uint64_t> chain)
      : hint_(std::move(hint)), chain_(std::move(chain)) {}
  ~PendingPrefix();
  PendingPrefix(const PendingPrefix&) = delete;
  PendingPrefix& operator=(const PendingPrefix&) = delete;
  size_t n_blocks() const { return chain_.size(); }

 private:
  std::shared_ptr<const PrefixHint> hint_;
  std::vector<uint64_t> chain_;
};

class PrefixHint : public std::enable_shared_from_this<PrefixHint> {
 public:
  PrefixHint(uint64_t model_variant, int block_size) : variant_(model_variant), block_size_(block_size) {}

  void add(uint64_t hash);
  void drop(uint64_t hash);
  // Whether the spill tier holds the block of this hash (any thread).
  void set_spilled(uint64_t hash, bool held) const;

  // Leading prompt tokens, in whole blocks, whose blocks are cached now, or, with
  // `with_pending`, cached or pending. At most prompt.size() - 1: the last prompt token is
  // always computed (its logits are needed).
  // `scope` is the prefix-cache scope the prompt would run in (KvCacheManager).
  // With `with_spilled`, a block the spill tier holds counts as cached.
  int cached_tokens(std::span<const int32_t> prompt, bool with_pending = false, uint64_t scope = 0,
                    bool with_spilled = false) const;
  // Marks the prompt's full blocks pending until the returned handle is dropped (holds of
  // the same block count up). The hint must be owned by a shared_ptr.
  std::shared_ptr<const PendingPrefix> hold_pending(std::span<const int32_t> prompt, uint64_t scope = 0) const;
  size_t size() const;
  size_t pending_size() const;
  // The hashes of the prompt's leading full blocks that are not cached in memory but held
  // by the spill tier, up to the first block in neither (what a prefetch should read).
  std::vector<uint64_t> spilled_chain(std::span<const int32_t> prompt, uint64_t scope = 0) const;
  size_t spilled_size() const;
  bool spilled(uint64_t hash) const;

 private:
  friend class PendingPrefix;
  std::vector<uint64_t> chain(std::span<const int32_t> prompt, uint64_t scope) const;
  void drop_pending(const std::vector<uint64_t>& chain) const;

  uint64_t variant_;
  int block_size_;
  mutable std::mutex mu_;
  std::unordered_set<uint64_t> hashes_;
  mutable std::unordered_map<uint64_t, int> pending_;  // hash -> holds
  mutable std::unordered_set<uint64_t> spilled_;
};

}  // namespace metro::kv
