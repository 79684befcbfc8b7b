// A bounded cache of word -> token ids for BPE encoding. Prose repeats a few thousand words
// over and over; a hit skips the merge loop entirely.
//
// Safe for concurrent use: entries live in shards, each behind its own mutex, so threads
// encoding at once rarely wait on each other. Each shard is a direct-mapped table of
// fixed-size entries (no allocation after construction); a new word simply replaces
// whatever occupied its slot.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

namespace metro::tokenizer {

class WordCache {
 public:
  // An entry fills one 64-byte cache line; longer words are rare and simply not cached.
  static constexpr size_t kMaxWordBytes = 22;
  static constexpr size_t kMaxIds = 8;
  static constexpr size_t kShards = 16;

  // Room for about `capacity` words in all (rounded to powers of two); 0: never caches.
  explicit WordCache(size_t capacity);
  WordCache(const WordCache&) = delete;
  WordCache& operator=(const WordCache&) = delete;

  // Appends the cached ids of `word` to `out`; false on a miss.
  bool lookup(std::string_view word, std::vector<int32_t>& out) const;
  void insert(std::string_view word, std::span<const int32_t> ids) const;

 private:
  struct alignas(64) Entry {
    uint64_t hash = 0;  // 0: empty
    uint8_t word_len = 0;
    uint8_t n_ids = 0;
    char word[kMaxWordBytes];
    int32_t ids[kMaxIds];
  };
  static_assert(sizeof(Entry) == 64);
  struct Shard {
    std::mutex mu;
    std::vector<Entry> entries;
  };
  size_t mask_ = 0;
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace metro::tokenizer
