// A dynamic batching window for non-generative requests (embeddings): requests wait a
// little so that one forward pass serves several of them, but never longer than their
// class can afford.
//
// Per class: a maximum batch size and a maximum wait, the wait derived from the class's
// TTFT objective (wait_fraction x ttft, at most max_wait_cap_s: realtime 25 ms, standard
// 100 ms, batch 500 ms with the defaults). A batch is due when a class has max_batch items
// queued, when the queued prompt tokens reach max_batch_tokens, or when the oldest item of
// a class has waited its class's maximum. A due batch takes items in class order (realtime
// first) and arrival order inside a class, up to the due class's batch size and the token
// cap: lower classes ride along when there is room, higher ones always go first.
//
// Not thread-safe: one owner (the embedding dispatcher) calls it, driven by its timer
// (next_deadline_ns) and by push().
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "base/status.h"
#include "base/sla.h"

namespace metro::gateway {

struct BatchWindowConfig {
  std::array<int, kNumSlaClasses> max_batch = {16, 32, 64};
  int max_batch_tokens = 8192;
  double wait_fraction = 0.05;
  double max_wait_cap_s = 0.5;
};

Status validate(const BatchWindowConfig& cfg);

class BatchWindow {
 public:
  BatchWindow(const BatchWindowConfig& cfg, const SlaConfig& sla);  // cfg must pass validate()

  double max_wait_s(SlaClass c) const { return max_wait_s_[static_cast<size_t>(c)]; }

  void push(uint64_t id, SlaClass c, int n_tokens, int64_t now_ns);
  // Drops a queued request (its client went away); false if it is not queued.
  bool cancel(uint64_t id);
  // The ids of a batch to run now, or an empty vector when none is due.
  std::vector<uint64_t> take_ready(int64_t now_ns);
  // When the oldest queued item reaches its maximum wait; nullopt when nothing is queued.
  std::optional<int64_t> next_deadline_ns() const;
  size_t size() const;

 private:
  struct Item {
    uint64_t id;
    int n_tokens;
    int64_t enqueued_ns;
  };
  std::optional<SlaClass> due_class(int64_t now_ns) const;

  BatchWindowConfig cfg_;
  std::array<double, kNumSlaClasses> max_wait_s_{};
  std::array<int64_t, kNumSlaClasses> max_wait_ns_{};
  std::array<std::deque<Item>, kNumSlaClasses> queues_;
  int64_t queued_tokens_ = 0;
};

}  // namespace metro::gateway
