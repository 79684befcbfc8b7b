#include "gateway/embed_batcher.h"

#include <chrono>
#include <limits>
#include <optional>
#include <utility>

#include "base/check.h"
#include "base/clock.h"

namespace metro::gateway {

EmbedBatcher::EmbedBatcher(const BatchWindowConfig& cfg, const SlaConfig& sla, bool own_thread)
    : window_(cfg, sla) {
  if (own_thread) thread_ = std::thread([this] { loop(); });
}

EmbedBatcher::~EmbedBatcher() { stop(); }

void EmbedBatcher::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& batch : take_due(std::numeric_limits<int64_t>::max(), /*flush=*/true)) run(std::move(batch));
}

uint64_t EmbedBatcher::hold(uint64_t group, SlaClass c, int n_tokens, Submit submit,
                            std::vector<engine::Request> requests, Done done, int64_t now) {
  METRO_CHECK(!requests.empty() && submit && done);
  uint64_t ticket = 0;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) {
      lock.unlock();
      done(submit(std::move(requests)));
      return 0;
    }
    ticket = next_ticket_++;
    items_.emplace(ticket, Item{group, std::move(submit), std::move(requests), std::move(done)});
    window_.push(ticket, c, n_tokens, now < 0 ? now_ns() : now);
    ++stats_.held;
  }
  cv_.notify_all();  // a full class is due at once; otherwise the deadline may be earlier
  return ticket;
}

bool EmbedBatcher::cancel(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!window_.cancel(ticket)) return false;
  items_.erase(ticket);
  ++stats_.cancelled;
  return true;
}

int EmbedBatcher::poll(int64_t now) {
  std::vector<std::vector<Item>> due = take_due(now, /*flush=*/false);
  for (auto& batch : due) run(std::move(batch));
  return static_cast<int>(due.size());
}

EmbedBatcherStats EmbedBatcher::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EmbedBatcherStats s = stats_;
  s.waiting = window_.size();
  return s;
}

std::vector<std::vector<EmbedBatcher::Item>> EmbedBatcher::take_due(int64_t now, bool flush) {
  std::vector<std::vector<Item>> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (;;) {
    const std::vector<uint64_t> ids = window_.take_ready(flush ? std::numeric_limits<int64_t>::max() : now);
    if (ids.empty()) break;
    std::vector<Item> batch;
    for (uint64_t id : ids) {
      auto it = items_.find(id);
      METRO_CHECK(it != items_.end());
      stats_.submitted += it->second.requests.size();
      batch.push_back(std::move(it->second));
      items_.erase(it);
    }
    // One submission per engine the batch spans (in practice one).
    std::vector<uint64_t> groups;
    for (const Item& it : batch) {
      bool seen = false;
      for (uint64_t g : groups) seen = seen || g == it.group;
      if (!seen) groups.push_back(it.group);
    }
    stats_.batches += groups.size();
    out.push_back(std::move(batch));
  }
  return out;
}

void EmbedBatcher::run(std::vector<Item> batch) {
  std::vector<bool> taken(batch.size(), false);
  for (size_t first = 0; first < batch.size(); ++first) {
    if (taken[first]) continue;
    // Every item for this engine, in window order, in one submission.
    std::vector<std::pair<size_t, size_t>> members;  // item, its number of requests
    std::vector<engine::Request> requests;
    for (size_t i = first; i < batch.size(); ++i) {
      if (taken[i] || batch[i].group != batch[first].group) continue;
      taken[i] = true;
      members.emplace_back(i, batch[i].requests.size());
      for (engine::Request& r : batch[i].requests) requests.push_back(std::move(r));
    }
    const size_t n = requests.size();
    std::vector<Expected<engine::Handle>> results = batch[first].submit(std::move(requests));
    METRO_CHECK_MSG(results.size() == n, "EmbedBatcher: submit must answer every request");
    size_t next = 0;
    for (const auto& [i, count] : members) {
      std::vector<Expected<engine::Handle>> mine;
      for (size_t k = 0; k < count; ++k) mine.push_back(std::move(results[next++]));
      batch[i].done(std::move(mine));
    }
  }
}

void EmbedBatcher::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (window_.size() == 0) {
      cv_.wait(lock, [&] { return stopping_ || window_.size() > 0; });
      continue;
    }
    // Holds from here on wake the wait below, even those made while poll() runs unlocked
    // (one of them may fill its class).
    const uint64_t held = stats_.held;
    lock.unlock();
    poll(now_ns());
    lock.lock();
    const std::optional<int64_t> d = window_.next_deadline_ns();
    if (stopping_ || !d) continue;
    // Until the oldest item's wait is up, or a new item comes.
    cv_.wait_for(lock, std::chrono::nanoseconds(std::max<int64_t>(0, *d - now_ns())),
                 [&] { return stopping_ || stats_.held != held; });
  }
}

}  // namespace metro::gateway
