#include "router/kv_subscriber.h"

#include <optional>

namespace metro::router {

Expected<std::unique_ptr<KvSubscriber>> KvSubscriber::start(const std::vector<std::string>& endpoints,
                                                            KvIndex* index) {
  for (const std::string& ep : endpoints) {
    if (ep.rfind("tcp://", 0) != 0 && ep.rfind("ipc://", 0) != 0) {
      return invalid_argument("--kv-events '" + ep + "': expected a ZeroMQ endpoint, tcp://HOST:PORT");
    }
  }
  METRO_ASSIGN_OR_RETURN(std::shared_ptr<ZmqLib> z, ZmqLib::load("--kv-events"));
  std::unique_ptr<KvSubscriber> s(new KvSubscriber());
  s->zmq_ = z;
  s->index_ = index;
  s->ctx_ = z->ctx_new();
  if (s->ctx_ == nullptr) return internal_error("zmq_ctx_new failed: " + z->error());
  for (const std::string& ep : endpoints) {
    void* sub = z->socket(s->ctx_, ZmqLib::kSub);
    if (sub == nullptr) return internal_error("zmq_socket failed: " + z->error());
    s->subs_.push_back(sub);
    const int linger = 0;
    z->setsockopt(sub, ZmqLib::kLinger, &linger, sizeof(linger));
    z->setsockopt(sub, ZmqLib::kSubscribe, "", 0);
    if (z->connect(sub, ep.c_str()) != 0) return unavailable("--kv-events: cannot connect " + ep + ": " + z->error());
  }
  s->thread_ = std::thread([raw = s.get()] { raw->run(); });
  return s;
}

KvSubscriber::~KvSubscriber() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (zmq_) {
    for (void* sub : subs_) zmq_->close(sub);
    if (ctx_ != nullptr) zmq_->ctx_term(ctx_);
  }
}

void KvSubscriber::run() {
  std::vector<ZmqLib::PollItem> items;
  for (void* sub : subs_) items.push_back({sub, 0, ZmqLib::kPollIn, 0});
  std::vector<std::optional<uint64_t>> last(subs_.size());
  std::vector<char> buf(size_t{16} << 20);
  while (!stop_.load()) {
    for (auto& it : items) it.revents = 0;
    if (zmq_->poll(items.data(), static_cast<int>(items.size()), 100) <= 0) continue;
    for (size_t r = 0; r < items.size(); ++r) {
      if (!(items[r].revents & ZmqLib::kPollIn)) continue;
      // Drain the message's parts; only a whole [topic, seq, payload] is applied.
      std::vector<std::string> parts;
      bool truncated = false;
      for (;;) {
        const int n = zmq_->recv(subs_[r], buf.data(), buf.size(), ZmqLib::kDontWait);
        if (n < 0) break;
        truncated = truncated || static_cast<size_t>(n) > buf.size();
        parts.emplace_back(buf.data(), std::min(static_cast<size_t>(n), buf.size()));
        int more = 0;
        size_t len = sizeof(more);
        if (zmq_->getsockopt(subs_[r], ZmqLib::kRcvMore, &more, &len) != 0 || !more) break;
      }
      if (parts.empty()) continue;
      if (truncated || parts.size() != 3 || parts[1].size() != 8) {
        ++bad_;
        index_->clear(static_cast<int>(r));
        last[r].reset();
        continue;
      }
      uint64_t seq = 0;
      for (char c : parts[1]) seq = (seq << 8) | static_cast<uint8_t>(c);
      if (last[r] && seq != *last[r] + 1) {
        ++gaps_;
        index_->clear(static_cast<int>(r));
      }
      last[r] = seq;
      if (index_->apply(static_cast<int>(r), parts[2]).ok()) {
        ++batches_;
      } else {
        ++bad_;
        index_->clear(static_cast<int>(r));
      }
    }
  }
}

}  // namespace metro::router
