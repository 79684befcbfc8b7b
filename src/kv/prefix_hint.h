// PrefixHint: a thread-safe mirror of the prefix cache's block hashes, so that threads other
// than the engine's (the gateway deciding admission) can estimate how much of a prompt the
// cache would serve without touching the cache itself.
//
// The engine thread keeps it current (KvBlockPool reports every hash it registers and
// drops); a lookup hashes the prompt's full blocks the way KvCacheManager does and counts
// the leading ones present. It is an estimate: a block may be evicted between the lookup
// and the request's first step, and hashes are compared without the cache's token check.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <unordered_set>

namespace metro::kv {

class PrefixHint {
 public:
  PrefixHint(uint64_t model_variant, int block_size) : variant_(model_variant), block_size_(block_size) {}

  void add(uint64_t hash);
  void drop(uint64_t hash);

  // Leading prompt tokens, in whole blocks, whose blocks are cached now. At most
  // prompt.size() - 1: the last prompt token is always computed (its logits are needed).
  int cached_tokens(std::span<const int32_t> prompt) const;
  size_t size() const;

 private:
  uint64_t variant_;
  int block_size_;
  mutable std::mutex mu_;
  std::unordered_set<uint64_t> hashes_;
};

}  // namespace metro::kv
