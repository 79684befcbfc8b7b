#include "kv/block_pool.h"

#include <algorithm>

#include "base/check.h"
#include "kv/kv_events.h"
#include "kv/prefix_hint.h"

namespace metro::kv {

KvBlockPool::KvBlockPool(int32_t n_blocks, int block_size)
    : block_size_(block_size),
      ref_(static_cast<size_t>(n_blocks), 0),
      prev_(static_cast<size_t>(n_blocks), kNoBlock),
      next_(static_cast<size_t>(n_blocks), kNoBlock),
      in_free_(static_cast<size_t>(n_blocks), 0),
      has_hash_(static_cast<size_t>(n_blocks), 0),
      hash_(static_cast<size_t>(n_blocks), 0),
      parent_hash_(static_cast<size_t>(n_blocks), 0),
      tokens_(static_cast<size_t>(n_blocks) * static_cast<size_t>(block_size), 0) {
  METRO_CHECK(n_blocks >= 0 && block_size > 0);
  for (BlockId b = 0; b < n_blocks; ++b) push_free_tail(b);
}

void KvBlockPool::push_free_tail(BlockId b) {
  const size_t i = static_cast<size_t>(b);
  METRO_DCHECK(!in_free_[i]);
  prev_[i] = tail_;
  next_[i] = kNoBlock;
  if (tail_ != kNoBlock) next_[static_cast<size_t>(tail_)] = b;
  tail_ = b;
  if (head_ == kNoBlock) head_ = b;
  in_free_[i] = 1;
  ++n_free_;
}

void KvBlockPool::remove_free(BlockId b) {
  const size_t i = static_cast<size_t>(b);
  METRO_CHECK(in_free_[i]);
  if (prev_[i] != kNoBlock) next_[static_cast<size_t>(prev_[i])] = next_[i];
  else head_ = next_[i];
  if (next_[i] != kNoBlock) prev_[static_cast<size_t>(next_[i])] = prev_[i];
  else tail_ = prev_[i];
  prev_[i] = next_[i] = kNoBlock;
  in_free_[i] = 0;
  --n_free_;
}

void KvBlockPool::drop_hash(BlockId b) {
  const size_t i = static_cast<size_t>(b);
  if (!has_hash_[i]) return;
  auto it = by_hash_.find(hash_[i]);
  if (it != by_hash_.end() && it->second == b) {
    by_hash_.erase(it);
    if (hint_ != nullptr) hint_->drop(hash_[i]);
    if (events_ != nullptr) events_->removed(hash_[i]);
  }
  has_hash_[i] = 0;
}

std::optional<BlockId> KvBlockPool::allocate() {
  if (head_ == kNoBlock) return std::nullopt;
  const BlockId b = head_;
  remove_free(b);
  const size_t i = static_cast<size_t>(b);
  if (has_hash_[i] && on_evict_) {
    on_evict_(b, hash_[i], parent_hash_[i],
              std::span<const int32_t>(tokens_.data() + i * static_cast<size_t>(block_size_),
                                       static_cast<size_t>(block_size_)));
  }
  drop_hash(b);  // lazy eviction: the cached contents are about to be overwritten
  ref_[static_cast<size_t>(b)] = 1;
  return b;
}

void KvBlockPool::ref(BlockId b) {
  const size_t i = static_cast<size_t>(b);
  METRO_CHECK(b >= 0 && i < ref_.size());
  if (ref_[i] == 0) remove_free(b);
  ++ref_[i];
}

void KvBlockPool::unref(BlockId b) {
  const size_t i = static_cast<size_t>(b);
  METRO_CHECK(b >= 0 && i < ref_.size() && ref_[i] > 0);
  if (--ref_[i] == 0) {
    // Unhashed blocks hold nothing reusable: put them first in line for reuse so cached
    // blocks live longer. Hashed ones go to the tail (most recently freed, evicted last).
    if (!has_hash_[i]) {
      prev_[i] = kNoBlock;
      next_[i] = head_;
      if (head_ != kNoBlock) prev_[static_cast<size_t>(head_)] = b;
      head_ = b;
      if (tail_ == kNoBlock) tail_ = b;
      in_free_[i] = 1;
      ++n_free_;
    } else {
      push_free_tail(b);
    }
  }
}

std::optional<BlockId> KvBlockPool::lookup(uint64_t hash, uint64_t parent_hash,
                                           std::span<const int32_t> tokens) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const size_t i = static_cast<size_t>(it->second);
  if (parent_hash_[i] != parent_hash || tokens.size() != static_cast<size_t>(block_size_)) {
    return std::nullopt;
  }
  const int32_t* stored = tokens_.data() + i * static_cast<size_t>(block_size_);
  if (!std::equal(tokens.begin(), tokens.end(), stored)) return std::nullopt;
  return it->second;
}

void KvBlockPool::set_hash(BlockId b, uint64_t hash, uint64_t parent_hash,
                           std::span<const int32_t> tokens) {
  const size_t i = static_cast<size_t>(b);
  METRO_CHECK(tokens.size() == static_cast<size_t>(block_size_));
  if (has_hash_[i] || by_hash_.count(hash)) return;
  has_hash_[i] = 1;
  hash_[i] = hash;
  parent_hash_[i] = parent_hash;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + static_cast<long>(i * static_cast<size_t>(block_size_)));
  by_hash_.emplace(hash, b);
  if (hint_ != nullptr) hint_->add(hash);
  if (events_ != nullptr) {
    // A parent that is not a cached block (a chain's root, or evicted) is reported as none.
    events_->stored(hash, by_hash_.count(parent_hash) ? std::optional<uint64_t>(parent_hash) : std::nullopt, tokens);
  }
}

}  // namespace metro::kv
