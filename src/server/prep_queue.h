// The work a request needs before the gateway can decide on it (parse the body, render the
// chat template, tokenize), queued per tenant and run by a fixed set of threads that take
// tenants in turn. One tenant's flood of huge prompts then delays other tenants by at most
// the jobs already running, never by its whole backlog, and the queue is bounded in total
// and per tenant, in jobs and in the bytes of the request bodies they hold: what does not
// fit is refused at once (503) instead of waiting. The byte bounds are what stop a flood of
// large bodies; the job bounds are loose, so that a burst of small requests from one tenant
// (a single-tenant deployment's normal load) is queued, not refused.
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
  int max_queued = 4096;                             // jobs waiting, over all tenants
  int max_queued_per_tenant = 1024;                  // jobs one tenant may have waiting
  size_t max_queued_bytes = size_t{256} << 20;       // body bytes waiting, over all tenants
  size_t max_queued_bytes_per_tenant = size_t{64} << 20;  // of which one tenant's
};

class PrepQueue {
 public:
  explicit PrepQueue(const PrepQueueLimits& limits);
  ~PrepQueue();  // stops (jobs still waiting are dropped) and joins the threads
  PrepQueue(const PrepQueue&) = delete;
  PrepQueue& operator=(const PrepQueue&) = delete;

  enum class Submit { kQueued, kFull, kTenantFull, kStopped };
  // `bytes`: what the job holds (the request body), counted against the byte bounds until
  // the job starts. A job larger than a byte bound on its own is still queued when nothing
  // of its kind (its tenant's, or anyone's) is waiting, so no size of body is refused on an
  // idle queue.
  Submit submit(const std::string& tenant, size_t bytes, std::function<void()> job);
  // Runs what is queued, then stops the threads (idempotent).
  void drain_and_join();

  size_t queued() const;
  size_t queued_bytes() const;

 private:
  void work();

  const PrepQueueLimits limits_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Job {
    size_t bytes = 0;
    std::function<void()> run;
  };
  struct TenantJobs {
    std::deque<Job> jobs;
    size_t bytes = 0;
  };
  std::unordered_map<std::string, TenantJobs> by_tenant_;
  std::deque<std::string> turn_;  // tenants with jobs waiting, in the order they are served
  size_t queued_ = 0;
  size_t queued_bytes_ = 0;
  bool stopping_ = false;
  bool drain_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace metro::server
