#include "server/prep_queue.h"

#include <algorithm>
#include <utility>

namespace metro::server {

PrepQueue::PrepQueue(const PrepQueueLimits& limits) : limits_(limits) {
  const int n = std::max(1, limits_.threads);
  threads_.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { work(); });
}

PrepQueue::~PrepQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void PrepQueue::drain_and_join() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    drain_ = true;
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

PrepQueue::Submit PrepQueue::submit(const std::string& tenant, std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Submit::kStopped;
    if (queued_ >= static_cast<size_t>(std::max(1, limits_.max_queued))) return Submit::kFull;
    auto& q = by_tenant_[tenant];
    if (q.size() >= static_cast<size_t>(std::max(1, limits_.max_queued_per_tenant))) return Submit::kTenantFull;
    if (q.empty()) turn_.push_back(tenant);
    q.push_back(std::move(job));
    ++queued_;
  }
  cv_.notify_one();
  return Submit::kQueued;
}

size_t PrepQueue::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_;
}

void PrepQueue::work() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return queued_ > 0 || stopping_; });
      if (queued_ == 0 || (stopping_ && !drain_)) return;
      // The tenant whose turn it is gives one job and, if it has more, goes to the back.
      std::string tenant = std::move(turn_.front());
      turn_.pop_front();
      auto it = by_tenant_.find(tenant);
      job = std::move(it->second.front());
      it->second.pop_front();
      --queued_;
      if (it->second.empty()) {
        by_tenant_.erase(it);
      } else {
        turn_.push_back(std::move(tenant));
      }
    }
    job();
  }
}

}  // namespace metro::server
