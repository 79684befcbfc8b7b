// The work a request needs before the gateway can decide on it (parse the body, render the
// chat template, tokenize), queued per tenant and run by a fixed set of threads that take
// tenants in turn. One tenant's flood of huge prompts then delays other tenants by at most
// the jobs already running, never by its whole backlog, and the queue is bounded in total
// and per tenant: what does not fit is refused at once (503) instead of waiting.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace metro::server {

struct PrepQueueLimits {
  int threads = 2;
  int max_queued = 512;            // jobs waiting, over all tenants
  int max_queued_per_tenant = 64;  // jobs one tenant may have waiting
};

class PrepQueue {
 public:
  explicit PrepQueue(const PrepQueueLimits& limits);
  ~PrepQueue();  // stops (jobs still waiting are dropped) and joins the threads
  PrepQueue(const PrepQueue&) = delete;
  PrepQueue& operator=(const PrepQueue&) = delete;

  enum class Submit { kQueued, kFull, kTenantFull, kStopped };
  Submit submit(const std::string& tenant, std::function<void()> job);
  // Runs what is queued, then stops the threads (idempotent).
  void drain_and_join();

  size_t queued() const;

 private:
  void work();

  const PrepQueueLimits limits_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, std::deque<std::function<void()>>> by_tenant_;
  std::deque<std::string> turn_;  // tenants with jobs waiting, in the order they are served
  size_t queued_ = 0;
  bool stopping_ = false;
  bool drain_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace metro::server
