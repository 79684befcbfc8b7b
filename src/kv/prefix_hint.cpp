#include "kv/prefix_hint.h"

#include <vector>

#include "kv/kv_cache_manager.h"

namespace metro::kv {

void PrefixHint::add(uint64_t hash) {
  std::lock_guard<std::mutex> lock(mu_);
  hashes_.insert(hash);
}

void PrefixHint::drop(uint64_t hash) {
  std::lock_guard<std::mutex> lock(mu_);
  hashes_.erase(hash);
}

size_t PrefixHint::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hashes_.size();
}

int PrefixHint::cached_tokens(std::span<const int32_t> prompt) const {
  if (prompt.size() < 2) return 0;
  const size_t bs = static_cast<size_t>(block_size_);
  const size_t full = (prompt.size() - 1) / bs;  // blocks that leave the last token out
  // Hash outside the lock: the engine thread takes it for every block it commits.
  std::vector<uint64_t> chain(full);
  uint64_t parent = KvCacheManager::root_hash_of(variant_);
  for (size_t i = 0; i < full; ++i) {
    parent = chain[i] = KvCacheManager::chain_hash(variant_, parent, prompt.subspan(i * bs, bs));
  }
  size_t n = 0;
  std::lock_guard<std::mutex> lock(mu_);
  while (n < full && hashes_.count(chain[n]) != 0) ++n;
  return static_cast<int>(n * bs);
}

}  // namespace metro::kv
