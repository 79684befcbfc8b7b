#include "gateway/batch_window.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/check.h"

namespace metro::gateway {


Status validate(const BatchWindowConfig& cfg) {
  for (int c = 0; c < kNumSlaClasses; ++c) {
    if (cfg.max_batch[static_cast<size_t>(c)] < 1) {
      return invalid_argument(std::string("batch window: max_batch for ") +
                              sla_class_name(static_cast<SlaClass>(c)) + " must be >= 1");
    }
  }
  if (cfg.max_batch_tokens < 1) return invalid_argument("batch window: max_batch_tokens must be >= 1");
  if (!(std::isfinite(cfg.wait_fraction) && cfg.wait_fraction >= 0.0 && cfg.wait_fraction <= 1.0)) {
    return invalid_argument("batch window: wait_fraction must be in [0, 1]");
  }
  if (!(std::isfinite(cfg.max_wait_cap_s) && cfg.max_wait_cap_s >= 0.0)) {
    return invalid_argument("batch window: max_wait_cap_s must be >= 0");
  }
  return Status();
}

BatchWindow::BatchWindow(const BatchWindowConfig& cfg, const SlaConfig& sla) : cfg_(cfg) {
  METRO_CHECK_MSG(validate(cfg_).ok(), "BatchWindow: invalid config (call validate())");
  for (int c = 0; c < kNumSlaClasses; ++c) {
    max_wait_s_[static_cast<size_t>(c)] =
        std::min(cfg_.max_wait_cap_s, cfg_.wait_fraction * sla.of(static_cast<SlaClass>(c)).ttft_s);
    max_wait_ns_[static_cast<size_t>(c)] = std::llround(max_wait_s_[static_cast<size_t>(c)] * 1e9);
  }
}

void BatchWindow::push(uint64_t id, SlaClass c, int n_tokens, int64_t now_ns) {
  const int n = std::max(0, n_tokens);
  queues_[static_cast<size_t>(c)].push_back({id, n, now_ns});
  queued_tokens_ += n;
}

bool BatchWindow::cancel(uint64_t id) {
  for (auto& q : queues_) {
    auto it = std::find_if(q.begin(), q.end(), [&](const Item& i) { return i.id == id; });
    if (it != q.end()) {
      queued_tokens_ -= it->n_tokens;
      q.erase(it);
      return true;
    }
  }
  return false;
}

size_t BatchWindow::size() const {
  size_t n = 0;
  for (const auto& q : queues_) n += q.size();
  return n;
}

std::optional<SlaClass> BatchWindow::due_class(int64_t now_ns) const {
  const bool tokens_full = queued_tokens_ >= cfg_.max_batch_tokens;
  for (int c = 0; c < kNumSlaClasses; ++c) {
    const auto& q = queues_[static_cast<size_t>(c)];
    if (q.empty()) continue;
    if (tokens_full || static_cast<int>(q.size()) >= cfg_.max_batch[static_cast<size_t>(c)] ||
        now_ns - q.front().enqueued_ns >= max_wait_ns_[static_cast<size_t>(c)]) {
      return static_cast<SlaClass>(c);
    }
  }
  return std::nullopt;
}

std::vector<uint64_t> BatchWindow::take_ready(int64_t now_ns) {
  std::vector<uint64_t> batch;
  const std::optional<SlaClass> due = due_class(now_ns);
  if (!due) return batch;
  const int cap = cfg_.max_batch[static_cast<size_t>(*due)];
  int64_t tokens = 0;
  for (auto& q : queues_) {
    while (!q.empty() && static_cast<int>(batch.size()) < cap) {
      const Item& it = q.front();
      // The token cap bounds the pass, but a single oversized item still runs alone.
      if (!batch.empty() && tokens + it.n_tokens > cfg_.max_batch_tokens) return batch;
      tokens += it.n_tokens;
      queued_tokens_ -= it.n_tokens;
      batch.push_back(it.id);
      q.pop_front();
    }
  }
  return batch;
}

std::optional<int64_t> BatchWindow::next_deadline_ns() const {
  std::optional<int64_t> next;
  for (int c = 0; c < kNumSlaClasses; ++c) {
    const auto& q = queues_[static_cast<size_t>(c)];
    if (q.empty()) continue;
    const int64_t d = q.front().enqueued_ns + max_wait_ns_[static_cast<size_t>(c)];
    if (!next || d < *next) next = d;
  }
  return next;
}

}  // namespace metro::gateway
