// KvEventLog: what the prefix cache gained and lost, in the order it happened, for
// publishing to fleet routers (`metro serve --kv-events`; server/kv_events_publisher.h).
//
// The block pool reports every full block it registers under a hash (stored) and every
// hash it drops (removed: evicted for reuse, or replaced). Consecutive stores of one chain
// (each block's parent the block stored just before) join into one event, as do
// consecutive removals, so that a prompt's blocks travel as one entry. The engine takes the
// log once per step.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace metro::kv {

struct KvEvent {
  enum class Kind : uint8_t { kStored, kRemoved, kAllCleared };
  Kind kind = Kind::kStored;
  std::vector<uint64_t> hashes;     // the blocks, in chain order for kStored
  std::optional<uint64_t> parent;   // kStored: the first block's parent, when it is a cached block
  std::vector<int32_t> token_ids;   // kStored: every block's tokens, back to back
};

class KvEventLog {
 public:
  void stored(uint64_t hash, std::optional<uint64_t> parent, std::span<const int32_t> tokens);
  void removed(uint64_t hash);
  void all_cleared();

  bool empty() const { return events_.empty(); }
  // The events since the last take(), oldest first.
  std::vector<KvEvent> take();

 private:
  std::vector<KvEvent> events_;
};

}  // namespace metro::kv
