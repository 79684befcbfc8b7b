// What each replica's prefix cache holds, as its KV events say (`metro serve --kv-events`:
// server/kv_events_publisher.h; vLLM's EventBatch, map or array layout).
//
// The index keys blocks by the router's own chained hash of their token ids, which
// BlockStored carries, and maps each replica block hash to that key: a replica's hashes
// are salted (by variant, by tenant) and opaque, but a prompt the router has token ids
// for (a replica's /tokenize) can be matched by its tokens. BlockRemoved and
// AllBlocksCleared take blocks away again. A stored chain whose parent the index does
// not know (its store was missed) is skipped: its keys cannot be computed.
// Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace metro::router {

class KvIndex {
 public:
  explicit KvIndex(size_t n_replicas, size_t max_blocks_per_replica = size_t{1} << 20);

  // Applies one EventBatch payload published by replica r. An error for bytes that are
  // not one (nothing applied); events it cannot place are skipped and counted.
  Status apply(int r, std::string_view payload);
  // Forgets what replica r holds (it left the pool, or its events had a gap).
  void clear(int r);

  // Tokens per block, as the replicas' BlockStored events say (0 before the first).
  int block_size() const;
  // How many leading whole blocks of `tokens` replica r holds.
  size_t matched(int r, std::span<const int32_t> tokens) const;
  size_t blocks(int r) const;
  uint64_t skipped() const;

  // The chained keys of the whole blocks of `tokens`.
  static std::vector<uint64_t> block_keys(std::span<const int32_t> tokens, int block_size);

 private:
  struct Replica {
    std::unordered_map<uint64_t, uint64_t> key_of;  // replica block hash -> key
    std::unordered_map<uint64_t, uint32_t> keys;    // key -> replica hashes holding it
  };
  void remove_locked(Replica& rep, uint64_t hash);

  const size_t max_blocks_;
  mutable std::mutex mu_;
  std::vector<Replica> reps_;
  int block_size_ = 0;
  uint64_t skipped_ = 0;
};

}  // namespace metro::router
