// The router's side of the replicas' KV events: one ZeroMQ SUB socket per replica
// (`metro router --kv-events ENDPOINT`, in --upstream order), every topic, each
// three-part message [topic, 8-byte big-endian sequence, EventBatch] applied to the
// index. A gap in a replica's sequence (a batch missed: the publisher dropped it, or the
// router joined late and the replica restarted) clears that replica's view, which fresh
// stores rebuild: a stale view would send requests to blocks long evicted.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "base/zmq_lib.h"
#include "router/kv_index.h"

namespace metro::router {

class KvSubscriber {
 public:
  static Expected<std::unique_ptr<KvSubscriber>> start(const std::vector<std::string>& endpoints, KvIndex* index);
  ~KvSubscriber();
  KvSubscriber(const KvSubscriber&) = delete;
  KvSubscriber& operator=(const KvSubscriber&) = delete;

  uint64_t batches() const { return batches_.load(); }
  uint64_t gaps() const { return gaps_.load(); }
  uint64_t bad() const { return bad_.load(); }

 private:
  KvSubscriber() = default;
  void run();

  std::shared_ptr<ZmqLib> zmq_;
  void* ctx_ = nullptr;
  std::vector<void*> subs_;
  KvIndex* index_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::atomic<uint64_t> batches_{0}, gaps_{0}, bad_{0};
};

}  // namespace metro::router
