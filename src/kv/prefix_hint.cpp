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

void PrefixHint::set_spilled(uint64_t hash, bool held) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (held) {
    spilled_.insert(hash);
  } else {
    spilled_.erase(hash);
  }
}

size_t PrefixHint::spilled_size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spilled_.size();
}

std::vector<uint64_t> PrefixHint::spilled_chain(std::span<const int32_t> prompt, uint64_t scope) const {
  const std::vector<uint64_t> c = chain(prompt, scope);
  std::vector<uint64_t> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (uint64_t h : c) {
    if (hashes_.count(h) != 0) continue;
    if (spilled_.count(h) == 0) break;
    out.push_back(h);
  }
  return out;
}

bool PrefixHint::spilled(uint64_t hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  return spilled_.count(hash) != 0;
}

size_t PrefixHint::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hashes_.size();
}

size_t PrefixHint::pending_size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

std::vector<uint64_t> PrefixHint::chain(std::span<const int32_t> prompt, uint64_t scope) const {
  if (prompt.size() < 2) return {};
  const size_t bs = static_cast<size_t>(block_size_);
  const size_t full = (prompt.size() - 1) / bs;  // blocks that leave the last token out
  std::vector<uint64_t> out(full);
  uint64_t parent = KvCacheManager::root_hash_of(variant_, scope);
  for (size_t i = 0; i < full; ++i) {
    parent = out[i] = KvCacheManager::chain_hash(variant_, parent, prompt.subspan(i * bs, bs));
  }
  return out;
}

int PrefixHint::cached_tokens(std::span<const int32_t> prompt, bool with_pending, uint64_t scope,
                              bool with_spilled) const {
  // Hash outside the lock: the engine thread takes it for every block it commits.
  const std::vector<uint64_t> c = chain(prompt, scope);
  size_t n = 0;
  std::lock_guard<std::mutex> lock(mu_);
  while (n < c.size() && (hashes_.count(c[n]) != 0 || (with_pending && pending_.count(c[n]) != 0) ||
                          (with_spilled && spilled_.count(c[n]) != 0))) {
    ++n;
  }
  return static_cast<int>(n * static_cast<size_t>(block_size_));
}

std::shared_ptr<const PendingPrefix> PrefixHint::hold_pending(std::span<const int32_t> prompt, uint64_t scope) const {
  std::vector<uint64_t> c = chain(prompt, scope);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t x : c) ++pending_[x];
  }
  return std::make_shared<const PendingPrefix>(shared_from_this(), std::move(c));
}

PendingPrefix::~PendingPrefix() { hint_->drop_pending(chain_); }

void PrefixHint::drop_pending(const std::vector<uint64_t>& c) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (uint64_t x : c) {
    auto it = pending_.find(x);
    if (it != pending_.end() && --it->second == 0) pending_.erase(it);
  }
}

}  // namespace metro::kv
