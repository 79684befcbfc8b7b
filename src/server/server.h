// `metro serve`: an OpenAI-compatible HTTP/1.1 server over one engine.
//
//   Server server(config, loader);
//   METRO_RETURN_IF_ERROR(server.start());   // listening; the models load in the background
//   int code = server.wait();                // 0 after a drain, 1 if loading failed
//
// Threads: `http_threads` Asio I/O threads (connections, timers, signals), `prep_threads`
// workers that parse, render chat templates and tokenize, one loader thread at start, and
// the engine's own thread and compute pool. I/O threads never wait on the engine.
//
// Shutdown (SIGTERM, SIGINT or request_drain()): stop accepting, close idle connections,
// answer new requests with 503, let in-flight requests finish for up to drain_timeout_s,
// then abort what is left and return 0 from wait(). A second SIGINT makes wait() return
// 130 at once; the caller should then exit without running destructors.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "base/status.h"
#include "gateway/front_door.h"
#include "server/server_config.h"

namespace metro::server {

class ServerCore;

class Server {
 public:
  // Loads the models and adds them to the front door (runs on the loader thread; may take
  // seconds). Model routes answer 503 until it returns.
  using Loader = std::function<Status(gateway::FrontDoor&)>;
  struct Callbacks {
    std::function<void(const gateway::FrontDoor&)> on_loaded;
    std::function<void(const Status&)> on_load_failed;
    std::function<void(const char* what)> on_drain;  // "SIGTERM", "SIGINT" or "request"
  };

  Server(ServerConfig config, Loader loader, Callbacks callbacks = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and listens (errors: the address is in use, bad host), then starts the threads
  // and the loader.
  Status start();
  uint16_t port() const { return port_; }
  // Blocks until the server has stopped; see the file comment for the exit codes.
  int wait();
  // As SIGTERM. Thread-safe.
  void request_drain();

  ServerCore& core() { return *core_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<ServerCore> core_;
  uint16_t port_ = 0;
};

}  // namespace metro::server
