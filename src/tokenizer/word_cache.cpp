#include "tokenizer/word_cache.h"

#include "base/hash.h"

namespace metro::tokenizer {

size_t WordCache::Hash::operator()(std::string_view s) const { return hash_string(s); }

bool WordCache::lookup(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() > kMaxWordBytes) return false;
  const size_t h = Hash{}(word);
  Shard& shard = shards_[(h >> 59) % kShards];
  std::lock_guard<std::mutex> lock(shard.mu);
  auto it = shard.map.find(word);
  if (it == shard.map.end()) return false;
  out.insert(out.end(), it->second.begin(), it->second.end());
  return true;
}

void WordCache::insert(std::string_view word, std::span<const int32_t> ids) const {
  if (word.size() > kMaxWordBytes) return;
  const size_t h = Hash{}(word);
  Shard& shard = shards_[(h >> 59) % kShards];
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.map.size() >= max_per_shard_) shard.map.clear();
  shard.map.try_emplace(std::string(word), ids.begin(), ids.end());
}

}  // namespace metro::tokenizer
