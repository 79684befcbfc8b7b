// A bounded cache of word -> token ids for BPE encoding. Prose repeats a few thousand words
// over and over; a hit skips the merge loop entirely.
//
// Safe for concurrent use: entries live in shards, each behind its own mutex, so threads
// encoding at once rarely wait on each other. A full shard is cleared (cheaper than LRU
// bookkeeping, and a frequent word is back after its next occurrence).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace metro::tokenizer {

class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 48;
  static constexpr size_t kShards = 16;

  explicit WordCache(size_t max_entries_per_shard = 2048) : max_per_shard_(max_entries_per_shard) {}
  WordCache(const WordCache&) = delete;
  WordCache& operator=(const WordCache&) = delete;

  // Appends the cached ids of `word` to `out`; false on a miss.
  bool lookup(std::string_view word, std::vector<int32_t>& out) const;
  void insert(std::string_view word, std::span<const int32_t> ids) const;

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const;
  };
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map;
  };
  size_t max_per_shard_;
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace metro::tokenizer
