// FileSpillTier: the prefix cache's blocks, once memory evicts them, kept in a file
// (`metro serve --kv-spill-dir DIR --kv-spill-bytes N`) and read back on a later hit when
// that is cheaper than computing them again.
//
// The file is an arena of block-sized slots, at most max_bytes, created in the directory and
// removed when the tier closes (a cache: a restart starts empty; files a dead process left
// there are removed when a tier opens). An evicted block's bytes
// are copied out of the KV arena at once (the pool reuses the block right after) and written
// by a thread of the tier's own; until then a hit is served from that copy. When the file is
// full the least recently used slot is taken. Each slot's key (chained hash, parent hash,
// tokens) and a checksum of its bytes stay in memory: a slot whose bytes no longer match
// (the file damaged or truncated) is dropped and its tokens are computed, never used. A
// failing write (a full disk) turns the tier off with one warning: eviction is then plain
// eviction again.
//
// Whether a hit is worth reading: the mean time a read has taken per block against the
// engine's fitted cost of computing the block's tokens at its position (set_recompute_cost);
// either unknown, it reads.
//
// Prefetch: when a request is admitted, the blocks of its prompt that the file holds are
// read (by the tier's thread, checksums verified) into memory ahead of the request's first
// step, so that the engine thread, which restores them when it schedules the prompt, copies
// from memory instead of waiting on the disk while every other request's step waits too.
// Staged copies are bounded (max_prefetch_bytes; the oldest goes first) and used once.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <span>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "kv/kv_arena.h"
#include "kv/prefix_hint.h"
#include "kv/spill.h"

namespace metro::kv {

struct FileSpillConfig {
  std::string dir;
  int64_t max_bytes = 0;                         // the file's bound (whole blocks)
  // Evicted blocks waiting to be written (their copies in memory); 0: the KV arena's size,
  // within [64 MiB, 1 GiB], so that evicting a whole arena's worth at once loses nothing.
  int64_t max_pending_bytes = 0;
  // Blocks read ahead by prefetch() and not yet restored; 0: half of max_pending_bytes.
  int64_t max_prefetch_bytes = 0;
};

struct FileSpillStats {
  int64_t blocks = 0;           // blocks in the file now
  int64_t bytes = 0;            // their bytes
  int64_t capacity_blocks = 0;  // slots in the file
  uint64_t writes = 0;          // blocks written
  uint64_t dropped = 0;         // evicted blocks not kept (writer behind, tier off)
  uint64_t restores = 0;        // blocks read back into memory
  uint64_t restore_bytes = 0;
  double restore_seconds = 0.0;
  uint64_t corrupt = 0;         // slots whose bytes failed their checksum
  uint64_t prefetched = 0;      // blocks read ahead into memory by prefetch()
  uint64_t prefetch_hits = 0;   // of the restores, those served from a block read ahead
  bool failed = false;          // a write failed: the tier keeps nothing more
};

class FileSpillTier : public KvSpillTier {
 public:
  // Errors: no directory, a bound below one block, a file that cannot be made.
  static Expected<std::unique_ptr<FileSpillTier>> open(const FileSpillConfig& cfg, KvArena& arena);
  ~FileSpillTier() override;  // stops the writer, removes the file
  FileSpillTier(const FileSpillTier&) = delete;
  FileSpillTier& operator=(const FileSpillTier&) = delete;

  void on_evict(BlockId b, uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) override;
  bool worth_restoring(uint64_t hash, int position) override;
  bool restore(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens, BlockId dst) override;

  // The engine's cost of computing prompt tokens: seconds per token, and per (query, key)
  // pair of attention (StepCostModel's terms). Any thread.
  void set_recompute_cost(double per_token_s, double per_pair_s);
  // Reads the blocks of these keys that the file holds into memory ahead of their restore
  // (the tier's thread; returns at once). Keys it does not hold are skipped, and no more are
  // queued than max_prefetch_bytes holds. Any thread.
  void prefetch(std::span<const uint64_t> hashes);
  // Mirrors the blocks the tier holds (queued or written) into `hint` from now on, so that
  // threads deciding admission can count them as cached (PrefixHint::set_spilled).
  void set_hint(std::shared_ptr<const PrefixHint> hint);
  // Waits until every evicted block handed over is written (or dropped) and every prefetch
  // asked for is read (or skipped).
  void flush();
  FileSpillStats stats() const;
  const std::string& path() const { return path_; }

 private:
  struct Pending {
    uint64_t hash = 0, parent = 0;
    std::vector<int32_t> tokens;
    std::vector<uint8_t> bytes;
  };
  struct Entry {
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    uint64_t checksum = 0;
    int64_t slot = 0;
    std::list<uint64_t>::iterator lru;
  };
  struct Staged {
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    std::vector<uint8_t> bytes;
  };
  FileSpillTier(const FileSpillConfig& cfg, KvArena& arena);
  void run();
  void read_ahead(std::unique_lock<std::mutex>& lock, uint64_t hash);  // one prefetch, on run()'s thread
  void erase_locked(uint64_t hash);  // an index entry and its slot
  void tell_hint_locked(uint64_t hash);  // whether the block is still held, to the hint

  FileSpillConfig cfg_;
  KvArena& arena_;
  size_t block_bytes_;
  std::string path_;
  int fd_ = -1;
  int64_t capacity_ = 0;  // slots

  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::deque<std::shared_ptr<Pending>> queue_;
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> pending_;  // queued or being written
  int64_t pending_bytes_ = 0;
  std::unordered_map<uint64_t, Entry> index_;
  std::deque<uint64_t> reads_;                       // prefetches asked for, not yet read
  std::unordered_map<uint64_t, Staged> staged_;      // read ahead, not yet restored
  std::deque<uint64_t> staged_order_;                // oldest first (may name restored ones)
  int64_t staged_bytes_ = 0;
  std::list<uint64_t> lru_;  // front: most recently used
  std::vector<int64_t> free_slots_;
  int64_t next_slot_ = 0;  // slots never used yet start here
  bool writing_ = false, stop_ = false;
  double per_token_s_ = 0.0, per_pair_s_ = 0.0;
  double read_s_per_block_ = 0.0;  // smoothed; 0: none measured
  std::shared_ptr<const PrefixHint> hint_;
  FileSpillStats stats_;
  std::vector<uint8_t> read_buf_;
  std::thread writer_;
};

}  // namespace metro::kv
