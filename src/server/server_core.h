// State shared by the listener, the connections and the routes of one Server.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "gateway/front_door.h"
#include "server/metrics.h"
#include "server/prep_queue.h"
#include "server/response_store.h"
#include "server/server_config.h"

namespace metro::server {

// A model file the admin API loads while serving.
struct ModelLoad {
  std::string id;     // name or name@variant
  std::string path;
  std::string state;  // "loading", "loaded", "failed"
  std::string error;
  double seconds = 0.0;
};

class ServerCore {
 public:
  ServerCore(ServerConfig config, PrepQueue* prep_pool);
  ~ServerCore();  // waits for model loads in progress
  ServerCore(const ServerCore&) = delete;
  ServerCore& operator=(const ServerCore&) = delete;

  // Loads `path` as `name` (`variant`) on a thread of its own, through config().load_model.
  // Errors: no loader, a load of the same id in progress.
  Status start_model_load(const std::string& name, const std::string& variant, const std::string& path);
  // Every load started, the latest last.
  std::vector<ModelLoad> model_loads() const;

  const ServerConfig& config() const { return config_; }
  ServerMetrics& metrics() { return metrics_; }
  // Parsing and tokenizing, per tenant in turn.
  PrepQueue& prep_pool() { return *prep_pool_; }
  // Quotas, admission and the served models (never null).
  gateway::FrontDoor& front_door() { return *front_door_; }
  const gateway::FrontDoor& front_door() const { return *front_door_; }
  // Stored /v1/responses answers.
  ResponseStore& responses() { return responses_; }

  // True once the loader has finished: model routes are served.
  bool loaded() const { return loaded_.load(std::memory_order_acquire); }
  void set_loaded() { loaded_.store(true, std::memory_order_release); }

  bool draining() const { return draining_.load(std::memory_order_acquire); }
  void set_draining() { draining_.store(true, std::memory_order_release); }

  // Connections register a callback that closes them if idle (used by a drain).
  uint64_t add_connection(std::function<void()> close_if_idle) {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t id = next_connection_id_++;
    connections_.emplace(id, std::move(close_if_idle));
    return id;
  }
  void remove_connection(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    connections_.erase(id);
  }
  void close_idle_connections() {
    std::vector<std::function<void()>> fns;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, fn] : connections_) fns.push_back(fn);
    }
    for (auto& fn : fns) fn();
  }

 private:
  void export_vllm_names(metrics::Exposition& e) const;

  const ServerConfig config_;
  std::shared_ptr<gateway::FrontDoor> front_door_;
  ServerMetrics metrics_;
  metrics::Registration metrics_registration_;
  PrepQueue* prep_pool_;
  ResponseStore responses_;
  std::atomic<bool> loaded_{false};
  std::atomic<bool> draining_{false};
  mutable std::mutex mu_;
  uint64_t next_connection_id_ = 1;
  std::unordered_map<uint64_t, std::function<void()>> connections_;
  mutable std::mutex loads_mu_;
  std::vector<ModelLoad> loads_;
  std::vector<std::thread> load_threads_;
};

}  // namespace metro::server
