// Byte-level BPE over one pre-tokenized word: start from one symbol per byte, then apply
// the best-ranked merge among adjacent pairs until none applies.
//
// Candidate pairs sit in a binary heap keyed by (rank, left position), the order in which
// the reference implementations apply them; a merge only adds the two pairs around the new
// symbol, and entries made stale by earlier merges are skipped when popped. A word of n
// bytes costs O(n log n), never a rescan of the whole word per merge.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace metro::tokenizer {

// (left id, right id) -> (rank, merged id); open addressing, built once, read-only after.
class MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t result = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  explicit MergeTable(std::span<const BpeMerge> merges);
  // nullptr when the pair never merges.
  const Entry* find(int32_t left, int32_t right) const {
    const uint64_t key = pack(left, right);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static uint64_t pack(int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  size_t slot(uint64_t key) const {
    key ^= key >> 29;
    key *= 0xbf58476d1ce4e5b9ull;
    key ^= key >> 32;
    return static_cast<size_t>(key) & mask_;
  }
  std::vector<Entry> entries_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

// Scratch reused across words of one encode call (not shared between threads).
struct BpeScratch {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t right;
    int32_t left_id;
    int32_t right_id;
    int32_t result;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::string encoded;
};

class BpeModel {
 public:
  BpeModel(const Vocab& vocab, bool ignore_merges);

  // Appends the ids of `word` (raw bytes) to `out`.
  void encode_word(std::string_view word, std::vector<int32_t>& out, BpeScratch& scratch) const;

 private:
  void push_candidate(BpeScratch& s, int32_t left, int32_t right) const;
  void emit_byte(uint8_t b, std::vector<int32_t>& out) const;

  const Vocab& vocab_;
  MergeTable merges_;
  // Merges of two single bytes, indexed by (first byte << 8 | second byte): every word
  // starts with these lookups, and a dense 512 KiB table answers them from cache.
  std::vector<MergeTable::Entry> byte_pairs_;
  ByteLevelMap byte_map_;
  bool ignore_merges_;
};

}  // namespace metro::tokenizer
