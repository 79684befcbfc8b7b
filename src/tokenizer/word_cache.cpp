#include "tokenizer/word_cache.h"

#include <bit>
#include <cstring>

#include "base/hash.h"

namespace metro::tokenizer {

WordCache::WordCache(size_t capacity) {
  if (capacity == 0) return;
  const size_t per_shard = std::bit_ceil(std::max<size_t>(1, capacity / kShards));
  mask_ = per_shard - 1;
  for (Shard& s : shards_) s.entries.resize(per_shard);
}

bool WordCache::lookup(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() > kMaxWordBytes || shards_[0].entries.empty()) return false;
  const uint64_t h = hash_string(word) | 1;
  Shard& shard = shards_[h >> 60];
  std::lock_guard<std::mutex> lock(shard.mu);
  const Entry& e = shard.entries[h & mask_];
  if (e.hash != h || e.word_len != word.size() || std::memcmp(e.word, word.data(), word.size()) != 0) {
    return false;
  }
  out.insert(out.end(), e.ids, e.ids + e.n_ids);
  return true;
}

void WordCache::insert(std::string_view word, std::span<const int32_t> ids) const {
  if (word.size() > kMaxWordBytes || ids.size() > kMaxIds || shards_[0].entries.empty()) return;
  const uint64_t h = hash_string(word) | 1;
  Shard& shard = shards_[h >> 60];
  std::lock_guard<std::mutex> lock(shard.mu);
  Entry& e = shard.entries[h & mask_];
  e.hash = h;
  e.word_len = static_cast<uint8_t>(word.size());
  e.n_ids = static_cast<uint8_t>(ids.size());
  std::memcpy(e.word, word.data(), word.size());
  std::memcpy(e.ids, ids.data(), ids.size() * sizeof(int32_t));
}

}  // namespace metro::tokenizer
