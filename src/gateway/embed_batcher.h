// The embeddings batching window in front of an engine: a held request waits in a
// BatchWindow (per-class maximum batch and maximum wait, the wait derived from the class's
// TTFT objective) and is submitted together with the others of its batch in one intake, so
// that an idle engine computes them in one step instead of one step each.
//
//   EmbedBatcher b(window_cfg, sla);                    // starts its timer thread
//   uint64_t t = b.hold(group, SlaClass::kBatch, n_tokens,
//                       [&](std::vector<Request> rs) { return engine->submit_all(std::move(rs)); },
//                       std::move(requests), [](std::vector<Expected<Handle>> hs) { ... });
//   b.cancel(t);  // the client left: true if it was still held (done is then never called)
//
// `submit` and `done` run on the batcher's thread (or the caller of poll()), outside its
// lock; `done` gets one result per request, in order. Items of the same `group` (one per
// engine) are submitted in one call. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"
#include "gateway/batch_window.h"

namespace metro::gateway {

struct EmbedBatcherStats {
  uint64_t held = 0;       // requests that entered the window
  uint64_t batches = 0;    // submissions (one per due batch and engine)
  uint64_t submitted = 0;  // requests submitted in them
  uint64_t cancelled = 0;  // left the window before submission
  uint64_t waiting = 0;    // in the window now
};

class EmbedBatcher {
 public:
  using Submit = std::function<std::vector<Expected<engine::Handle>>(std::vector<engine::Request>)>;
  using Done = std::function<void(std::vector<Expected<engine::Handle>>)>;

  // cfg must pass validate(). With own_thread false nothing runs until poll() (tests).
  EmbedBatcher(const BatchWindowConfig& cfg, const SlaConfig& sla, bool own_thread = true);
  // stop().
  ~EmbedBatcher();
  EmbedBatcher(const EmbedBatcher&) = delete;
  EmbedBatcher& operator=(const EmbedBatcher&) = delete;

  // Holds `requests` (one HTTP call's inputs; at least one) as one window item of
  // `n_tokens` prompt tokens, arriving at `now` (now_ns() clock; < 0: now). Returns a
  // ticket for cancel() (0 after stop(): submitted at once).
  uint64_t hold(uint64_t group, SlaClass c, int n_tokens, Submit submit,
                std::vector<engine::Request> requests, Done done, int64_t now = -1);
  bool cancel(uint64_t ticket);
  // Joins the thread and submits whatever is still held (nothing is dropped); later holds
  // are submitted at once, on the caller's thread. For a server shutting down: call it while
  // the callers' executors still run. Idempotent.
  void stop();
  // Submits every batch due at now_ns; returns how many submissions it made.
  int poll(int64_t now_ns);

  double max_wait_s(SlaClass c) const { return window_.max_wait_s(c); }
  EmbedBatcherStats stats() const;

 private:
  struct Item {
    uint64_t group = 0;
    Submit submit;
    std::vector<engine::Request> requests;
    Done done;
  };
  void loop();
  // Takes every due batch (and, when flushing, everything) out of the window.
  std::vector<std::vector<Item>> take_due(int64_t now_ns, bool flush);
  static void run(std::vector<Item> batch);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  BatchWindow window_;
  std::unordered_map<uint64_t, Item> items_;
  uint64_t next_ticket_ = 1;
  bool stopping_ = false;
  EmbedBatcherStats stats_;
  std::thread thread_;
};

}  // namespace metro::gateway
