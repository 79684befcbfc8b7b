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

PrepQueue::Submit PrepQueue::submit(const std::string& tenant, size_t bytes, std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Submit::kStopped;
    if (queued_ >= static_cast<size_t>(std::max(1, limits_.max_queued))) return Submit::kFull;
    if (queued_ > 0 && queued_bytes_ + bytes > limits_.max_queued_bytes) return Submit::kFull;
    auto it = by_tenant_.find(tenant);
    if (it != by_tenant_.end()) {
      const TenantJobs& mine = it->second;
      if (mine.jobs.size() >= static_cast<size_t>(std::max(1, limits_.max_queued_per_tenant))) {
        return Submit::kTenantFull;
      }
      if (mine.bytes + bytes > limits_.max_queued_bytes_per_tenant) return Submit::kTenantFull;
    } else {
      it = by_tenant_.emplace(tenant, TenantJobs{}).first;
      turn_.push_back(tenant);
    }
    it->second.jobs.push_back(Job{bytes, std::move(job)});
    it->second.bytes += bytes;
    ++queued_;
    queued_bytes_ += bytes;
  }
  cv_.notify_one();
  return Submit::kQueued;
}

size_t PrepQueue::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_;
}

size_t PrepQueue::queued_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_bytes_;
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
      Job next = std::move(it->second.jobs.front());
      it->second.jobs.pop_front();
      it->second.bytes -= next.bytes;
      job = std::move(next.run);
      --queued_;
      queued_bytes_ -= next.bytes;
      if (it->second.jobs.empty()) {
        by_tenant_.erase(it);
      } else {
        turn_.push_back(std::move(tenant));
      }
    }
    job();
  }
}

}  // namespace metro::server
