// `metro router`: an OpenAI-compatible front over metro replicas (docs/server.md,
// "Router"). It forwards each request whole to one replica picked by its policy
// (router/policy.h) and pipes the answer back as it comes, streams included.
//
//  - Each request gets its own upstream connection, spoken as HTTP/1.0 so the answer's body
//    ends with the connection; the client gets the replica's status, headers and body,
//    then the connection closes. A replica that vanishes mid-stream (its connection ends
//    before the stream's `data: [DONE]`) ends the client's stream with an error event
//    (code `upstream_lost`); one that stops answering is given up after --upstream-timeout.
//    Never a hang.
//  - Health: every --health-period each replica's /health and /metrics are read; a replica
//    that fails twice in a row (or refuses a connection) leaves the pool and forgets its
//    prefixes, and comes back at its first good answer. /metrics also gives its waiting
//    requests, which least-load and prefix weigh.
//  - With --kv-events, the prefix policy reads what each replica's cache holds from its KV
//    events and matches the prompt's token ids (a replica's /tokenize) against it; when no
//    replica holds any of the prompt, or events are off, it falls back to what it routed.
//  - The router's own /health (200 while a replica is healthy, else 503) and /metrics
//    (metro_router_*).
// One thread per open client connection (this is a first version: fine for hundreds).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "router/kv_index.h"
#include "router/kv_subscriber.h"
#include "router/policy.h"

namespace metro::router {

struct Upstream {
  std::string url;  // as given: http://HOST:PORT
  std::string host;
  uint16_t port = 0;
};
// "http://host:port" (a trailing / allowed); errors name what is wrong.
Expected<Upstream> parse_upstream(const std::string& url);

struct RouterConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 8090;
  std::vector<Upstream> upstreams;
  Policy policy = Policy::kPrefix;
  PrefixConfig prefix;
  double health_period_s = 1.0;
  double connect_timeout_s = 2.0;
  double upstream_timeout_s = 600.0;  // longest wait for a replica's next bytes
  size_t max_body_bytes = size_t{32} << 20;
  double drain_timeout_s = 30.0;
  // --kv-events: each replica's KV-event endpoint, in --upstream order (empty: off). With
  // them the prefix policy matches a prompt's token ids (from a replica's /tokenize)
  // against what each replica's cache holds (router/kv_index.h).
  std::vector<std::string> kv_events;
};

class Router {
 public:
  explicit Router(RouterConfig cfg);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Binds and listens, starts the health poller and the accept loop.
  Status start();
  uint16_t port() const { return port_; }
  // Stops accepting, waits for open requests up to drain_timeout_s, stops the threads.
  void stop();
  // The replicas' state (tests, /metrics).
  std::vector<ReplicaLoad> loads() const;

 private:
  struct Replica;
  void accept_loop();
  void serve(int fd);
  void poll_loop();
  void poll_once();
  // A health check's result; `at_once`: a refused connection takes it out without a second
  // failure.
  void mark(size_t r, bool ok, bool at_once = false);
  std::string metrics_text() const;
  // The token ids a replica's /tokenize gives the request's prompt (empty when it has none
  // or no replica answers); `auth`: the client's credentials, passed on.
  std::vector<int32_t> prompt_tokens(const std::string& body, const std::string& auth);

  RouterConfig cfg_;
  std::vector<std::unique_ptr<Replica>> replicas_;
  std::unique_ptr<Picker> picker_;
  std::unique_ptr<KvIndex> kv_index_;
  std::unique_ptr<KvSubscriber> kv_sub_;
  std::atomic<size_t> next_tokenizer_{0};
  std::atomic<uint64_t> kv_routed_{0}, tokenize_failed_{0};
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_, poller_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int open_connections_ = 0;
  std::atomic<uint64_t> no_replica_{0};
};

}  // namespace metro::router
