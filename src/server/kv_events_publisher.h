// `metro serve --kv-events ENDPOINT`: the engines' prefix-cache events (kv/kv_events.h)
// published over ZeroMQ in the layout vLLM publishes, so fleet routers that read vLLM's KV
// events (llm-d's precise prefix scheduler, Dynamo's KV router) can track metro's cache.
//
// Wire format, as vLLM's ZmqEventPublisher sends it: a PUB socket, one three-part message
// per batch: the topic, an 8-byte big-endian sequence number from 0, and a MessagePack
// EventBatch {ts, events, data_parallel_rank} whose events are BlockStored {block_hashes,
// parent_block_hash, token_ids, block_size, lora_id, medium, lora_name}, BlockRemoved
// {block_hashes, medium} and AllBlocksCleared, each tagged by its class name in "type".
// That is the map layout of current vLLM; `--kv-events-format array` sends the array layout
// of earlier releases (each struct as an array, the tag first). Medium is "CPU". One batch
// per engine step that changed the cache. Block hashes are metro's own 64-bit chained
// hashes (salted by model variant and, with the per-tenant prefix cache, by tenant):
// consumers use them as opaque ids and read the tokens from BlockStored.
//
// An endpoint with "*" binds (tcp://*:5557), any other connects (tcp://router:5557), as
// vLLM decides. `--kv-events-replay tcp://*:5558` binds a ROUTER: a request holding an
// 8-byte big-endian sequence number gets every buffered batch from it on ([seq, payload]
// per message), then [-1, ""].
//
// libzmq is loaded at run time (Debian's libzmq5): metro builds and runs without it, and
// only --kv-events asks for it, with a clear error when it is missing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "base/zmq_lib.h"
#include "kv/kv_events.h"

namespace metro::metrics {
class Exposition;
}

namespace metro::server {

struct KvEventsConfig {
  std::string endpoint;         // --kv-events
  std::string replay_endpoint;  // --kv-events-replay (empty: none)
  std::string topic;            // --kv-events-topic
  bool array_layout = false;    // --kv-events-format array
  size_t buffer_batches = 10000;  // kept for replay
  size_t max_queue = 10000;       // batches waiting to be sent; more are dropped and counted
};

// The MessagePack EventBatch of one engine step's events.
std::string encode_kv_event_batch(const std::vector<kv::KvEvent>& events, double ts, int block_size,
                                  bool array_layout);

class KvEventsPublisher {
 public:
  // Loads libzmq, opens and binds (or connects) the sockets, starts the sending thread.
  static Expected<std::shared_ptr<KvEventsPublisher>> start(const KvEventsConfig& config);
  ~KvEventsPublisher();
  KvEventsPublisher(const KvEventsPublisher&) = delete;
  KvEventsPublisher& operator=(const KvEventsPublisher&) = delete;

  // Any thread: queues one step's events of an engine whose blocks hold block_size tokens.
  void publish(std::vector<kv::KvEvent> events, int block_size);
  uint64_t published() const { return published_.load(); }
  uint64_t dropped() const { return dropped_.load(); }
  void export_metrics(metrics::Exposition& e) const;

 private:
  KvEventsPublisher() = default;
  void run();
  void serve_replay();

  KvEventsConfig cfg_;
  std::shared_ptr<ZmqLib> zmq_;
  void* ctx_ = nullptr;
  void* pub_ = nullptr;
  void* replay_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  struct Pending {
    std::vector<kv::KvEvent> events;
    int block_size;
    double ts;
  };
  std::deque<Pending> queue_;
  bool stop_ = false;
  std::deque<std::pair<int64_t, std::string>> sent_;  // the replay buffer (sending thread only)
  int64_t seq_ = 0;
  std::atomic<uint64_t> published_{0}, dropped_{0};
  std::thread thread_;
};

}  // namespace metro::server
