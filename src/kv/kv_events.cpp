#include "kv/kv_events.h"

#include <utility>

namespace metro::kv {

void KvEventLog::stored(uint64_t hash, std::optional<uint64_t> parent, std::span<const int32_t> tokens) {
  if (!events_.empty()) {
    KvEvent& last = events_.back();
    if (last.kind == KvEvent::Kind::kStored && parent && *parent == last.hashes.back()) {
      last.hashes.push_back(hash);
      last.token_ids.insert(last.token_ids.end(), tokens.begin(), tokens.end());
      return;
    }
  }
  KvEvent e;
  e.kind = KvEvent::Kind::kStored;
  e.hashes.push_back(hash);
  e.parent = parent;
  e.token_ids.assign(tokens.begin(), tokens.end());
  events_.push_back(std::move(e));
}

void KvEventLog::removed(uint64_t hash) {
  if (!events_.empty() && events_.back().kind == KvEvent::Kind::kRemoved) {
    events_.back().hashes.push_back(hash);
    return;
  }
  KvEvent e;
  e.kind = KvEvent::Kind::kRemoved;
  e.hashes.push_back(hash);
  events_.push_back(std::move(e));
}

void KvEventLog::all_cleared() {
  // Whatever came before is moot for a consumer that drops everything.
  events_.clear();
  KvEvent e;
  e.kind = KvEvent::Kind::kAllCleared;
  events_.push_back(std::move(e));
}

std::vector<KvEvent> KvEventLog::take() { return std::exchange(events_, {}); }

}  // namespace metro::kv
