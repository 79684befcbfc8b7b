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

  RouterConfig cfg_;
  std::vector<std::unique_ptr<Replica>> replicas_;
  std::unique_ptr<Picker> picker_;
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
