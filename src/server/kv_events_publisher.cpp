#include "server/kv_events_publisher.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <type_traits>
#include <utility>

#include "base/log.h"
#include "base/metrics.h"
#include "base/msgpack.h"
#include "base/zmq_lib.h"

namespace metro::server {


namespace {

void encode_event(MsgpackWriter& w, const kv::KvEvent& e, int block_size, bool array_layout) {
  auto hashes = [&] {
    w.array(e.hashes.size());
    for (uint64_t h : e.hashes) w.uint(h);
  };
  switch (e.kind) {
    case kv::KvEvent::Kind::kStored: {
      auto parent = [&] {
        if (e.parent) {
          w.uint(*e.parent);
        } else {
          w.nil();
        }
      };
      auto tokens = [&] {
        w.array(e.token_ids.size());
        for (int32_t t : e.token_ids) w.integer(t);
      };
      if (array_layout) {
        w.array(7);
        w.str("BlockStored");
        hashes();
        parent();
        tokens();
        w.integer(block_size);
        w.nil();  // lora_id
        w.str("CPU");
      } else {
        w.map(8);
        w.str("type");
        w.str("BlockStored");
        w.str("block_hashes");
        hashes();
        w.str("parent_block_hash");
        parent();
        w.str("token_ids");
        tokens();
        w.str("block_size");
        w.integer(block_size);
        w.str("lora_id");
        w.nil();
        w.str("medium");
        w.str("CPU");
        w.str("lora_name");
        w.nil();
      }
      break;
    }
    case kv::KvEvent::Kind::kRemoved:
      if (array_layout) {
        w.array(3);
        w.str("BlockRemoved");
        hashes();
        w.str("CPU");
      } else {
        w.map(3);
        w.str("type");
        w.str("BlockRemoved");
        w.str("block_hashes");
        hashes();
        w.str("medium");
        w.str("CPU");
      }
      break;
    case kv::KvEvent::Kind::kAllCleared:
      if (array_layout) {
        w.array(1);
      } else {
        w.map(1);
        w.str("type");
      }
      w.str("AllBlocksCleared");
      break;
  }
}

std::string seq_bytes(int64_t seq) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>(static_cast<uint64_t>(seq) >> (56 - 8 * i));
  return s;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string encode_kv_event_batch(const std::vector<kv::KvEvent>& events, double ts, int block_size,
                                  bool array_layout) {
  MsgpackWriter w;
  if (array_layout) {
    w.array(3);
    w.float64(ts);
  } else {
    w.map(3);
    w.str("ts");
    w.float64(ts);
    w.str("events");
  }
  w.array(events.size());
  for (const kv::KvEvent& e : events) encode_event(w, e, block_size, array_layout);
  if (!array_layout) w.str("data_parallel_rank");
  w.integer(0);
  return w.take();
}

Expected<std::shared_ptr<KvEventsPublisher>> KvEventsPublisher::start(const KvEventsConfig& config) {
  if (config.endpoint.rfind("tcp://", 0) != 0 && config.endpoint.rfind("ipc://", 0) != 0) {
    return invalid_argument("--kv-events takes a ZeroMQ endpoint: tcp://*:PORT to bind, tcp://HOST:PORT to connect");
  }
  METRO_ASSIGN_OR_RETURN(std::shared_ptr<ZmqLib> z, ZmqLib::load("--kv-events"));
  std::shared_ptr<KvEventsPublisher> p(new KvEventsPublisher());
  p->cfg_ = config;
  p->zmq_ = z;
  p->ctx_ = z->ctx_new();
  if (p->ctx_ == nullptr) return internal_error("zmq_ctx_new failed: " + z->error());
  p->pub_ = z->socket(p->ctx_, ZmqLib::kPub);
  if (p->pub_ == nullptr) return internal_error("zmq_socket failed: " + z->error());
  const int hwm = 100000, linger = 0;
  z->setsockopt(p->pub_, ZmqLib::kSndHwm, &hwm, sizeof(hwm));
  z->setsockopt(p->pub_, ZmqLib::kLinger, &linger, sizeof(linger));
  const bool bind = config.endpoint.find('*') != std::string::npos || config.endpoint.find("::") != std::string::npos ||
                    config.endpoint.rfind("ipc://", 0) == 0;
  if ((bind ? z->bind : z->connect)(p->pub_, config.endpoint.c_str()) != 0) {
    return unavailable("--kv-events: cannot " + std::string(bind ? "bind" : "connect") + " " + config.endpoint + ": " +
                       z->error());
  }
  if (!config.replay_endpoint.empty()) {
    p->replay_ = z->socket(p->ctx_, ZmqLib::kRouter);
    if (p->replay_ == nullptr) return internal_error("zmq_socket failed: " + z->error());
    z->setsockopt(p->replay_, ZmqLib::kLinger, &linger, sizeof(linger));
    if (z->bind(p->replay_, config.replay_endpoint.c_str()) != 0) {
      return unavailable("--kv-events-replay: cannot bind " + config.replay_endpoint + ": " + z->error());
    }
  }
  p->thread_ = std::thread([raw = p.get()] { raw->run(); });
  return p;
}

KvEventsPublisher::~KvEventsPublisher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (zmq_) {
    if (pub_ != nullptr) zmq_->close(pub_);
    if (replay_ != nullptr) zmq_->close(replay_);
    if (ctx_ != nullptr) zmq_->ctx_term(ctx_);
  }
}

void KvEventsPublisher::publish(std::vector<kv::KvEvent> events, int block_size) {
  if (events.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= cfg_.max_queue) {
      dropped_.fetch_add(1);
      return;
    }
    queue_.push_back({std::move(events), block_size, unix_now()});
  }
  cv_.notify_one();
}

// The sending thread owns the sockets: ZeroMQ sockets are not shared between threads.
void KvEventsPublisher::run() {
  for (;;) {
    Pending next;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // A replay request is answered within this wait.
      cv_.wait_for(lock, std::chrono::milliseconds(replay_ != nullptr ? 20 : 200),
                   [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) {
        if (stop_) return;
        lock.unlock();
        if (replay_ != nullptr) serve_replay();
        continue;
      }
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    std::string payload = encode_kv_event_batch(next.events, next.ts, next.block_size, cfg_.array_layout);
    const std::string seq = seq_bytes(seq_);
    zmq_->send(pub_, cfg_.topic.data(), cfg_.topic.size(), ZmqLib::kSndMore);
    zmq_->send(pub_, seq.data(), seq.size(), ZmqLib::kSndMore);
    zmq_->send(pub_, payload.data(), payload.size(), 0);
    published_.fetch_add(1);
    if (replay_ != nullptr) {
      sent_.emplace_back(seq_, std::move(payload));
      if (sent_.size() > cfg_.buffer_batches) sent_.pop_front();
      serve_replay();
    }
    ++seq_;
  }
}

// One waiting request, if any: [identity, "", 8-byte start] -> [identity, "", seq, payload]
// per buffered batch from start, then [identity, "", -1, ""].
void KvEventsPublisher::serve_replay() {
  ZmqLib::PollItem item{replay_, 0, ZmqLib::kPollIn, 0};
  if (zmq_->poll(&item, 1, 0) <= 0 || !(item.revents & ZmqLib::kPollIn)) return;
  std::vector<std::string> parts;
  for (;;) {
    char buf[256];
    const int n = zmq_->recv(replay_, buf, sizeof(buf), ZmqLib::kDontWait);
    if (n < 0) break;
    parts.emplace_back(buf, static_cast<size_t>(std::min<int>(n, static_cast<int>(sizeof(buf)))));
    int more = 0;
    size_t len = sizeof(more);
    if (zmq_->getsockopt(replay_, ZmqLib::kRcvMore, &more, &len) != 0 || !more) break;
  }
  if (parts.size() != 3 || parts[2].size() != 8) return;  // not a replay request
  int64_t start = 0;
  for (char c : parts[2]) start = static_cast<int64_t>((static_cast<uint64_t>(start) << 8) | static_cast<uint8_t>(c));
  const std::string& id = parts[0];
  auto reply = [&](const std::string& seq, const std::string& payload) {
    zmq_->send(replay_, id.data(), id.size(), ZmqLib::kSndMore);
    zmq_->send(replay_, "", 0, ZmqLib::kSndMore);
    zmq_->send(replay_, seq.data(), seq.size(), ZmqLib::kSndMore);
    zmq_->send(replay_, payload.data(), payload.size(), 0);
  };
  for (const auto& [seq, payload] : sent_) {
    if (seq >= start) reply(seq_bytes(seq), payload);
  }
  reply(seq_bytes(-1), "");
}

void KvEventsPublisher::export_metrics(metrics::Exposition& e) const {
  e.counter("metro_kv_events_published_total", "KV event batches published (--kv-events).", "",
            static_cast<double>(published()));
  e.counter("metro_kv_events_dropped_total",
            "KV event batches dropped because the publisher's queue was full (--kv-events).", "",
            static_cast<double>(dropped()));
}

}  // namespace metro::server
