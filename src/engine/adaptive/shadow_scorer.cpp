#include "engine/adaptive/shadow_scorer.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "base/log.h"

namespace metro::engine::adaptive {

namespace {

constexpr int kChunk = 64;  // tokens per forward pass

// log-softmax of one row, in double.
void log_softmax(std::span<const float> row, std::vector<double>& out) {
  double mx = -INFINITY;
  for (float v : row) mx = std::max(mx, static_cast<double>(v));
  double sum = 0.0;
  for (float v : row) sum += std::exp(static_cast<double>(v) - mx);
  const double lse = mx + std::log(sum);
  out.resize(row.size());
  for (size_t i = 0; i < row.size(); ++i) out[i] = static_cast<double>(row[i]) - lse;
}

size_t arg_max(std::span<const float> row) {
  return static_cast<size_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

}  // namespace

ShadowScorer::ShadowScorer(std::shared_ptr<const model::Model> high, std::shared_ptr<const model::Model> low,
                           ShadowConfig config)
    : high_(std::move(high)), low_(std::move(low)), cfg_(config) {
  if (cfg_.every > 0) thread_ = std::thread([this] { run(); });
}

ShadowScorer::~ShadowScorer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool ShadowScorer::wants_next() {
  if (cfg_.every <= 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return offered_++ % static_cast<uint64_t>(cfg_.every) == 0;
}

bool ShadowScorer::offer(std::vector<int32_t> tokens, int n_prompt) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool fits = n_prompt >= 1 && static_cast<int>(tokens.size()) > n_prompt &&
                    static_cast<int>(tokens.size()) <= cfg_.max_tokens;
  if (stopping_ || cfg_.every <= 0 || !fits || queue_.size() >= cfg_.max_queue) {
    ++snap_.dropped;
    return false;
  }
  queue_.push_back(Job{std::move(tokens), n_prompt});
  cv_.notify_one();
  return true;
}

ShadowSnapshot ShadowScorer::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snap_;
}

void ShadowScorer::reset_window() {
  std::lock_guard<std::mutex> lock(mu_);
  window_.clear();
  snap_.in_window = 0;
  snap_.kl_mean = 0.0;
  snap_.top1_mean = 0.0;
}

Expected<ShadowSample> ShadowScorer::score(const model::Model& high, const model::Model& low,
                                           std::span<const int32_t> tokens, int n_prompt, ThreadPool& pool) {
  const int n = static_cast<int>(tokens.size());
  if (n_prompt < 1 || n <= n_prompt) return invalid_argument("shadow score: no output to score");
  model::WorkspaceLimits lim;
  lim.max_tokens = kChunk;
  lim.max_logits = kChunk;
  lim.max_seqs = 1;
  lim.max_blocks_per_seq = (n + 15) / 16 + 1;
  model::Workspace ws_high = high.make_workspace(lim), ws_low = low.make_workspace(lim);
  model::SequenceKv kv_high(high, n), kv_low(low, n);
  ShadowSample s;
  double kl_sum = 0.0;
  int agree = 0;
  std::vector<double> lp, lq;
  for (int start = 0; start < n - 1; start += kChunk) {
    const int end = std::min(n - 1, start + kChunk);
    model::Batch b;
    // Logits of position i predict token i + 1: the output positions are [n_prompt - 1, n - 1).
    for (int i = start; i < end; ++i) b.add(tokens[static_cast<size_t>(i)], i, 0, i >= n_prompt - 1);
    METRO_ASSIGN_OR_RETURN(model::ForwardOutput oh, high.forward(b, kv_high.view(), ws_high, pool));
    METRO_ASSIGN_OR_RETURN(model::ForwardOutput ol, low.forward(b, kv_low.view(), ws_low, pool));
    for (int r = 0; r < oh.n_rows; ++r) {
      log_softmax(oh.row(r), lp);
      log_softmax(ol.row(r), lq);
      double kl = 0.0;
      for (size_t v = 0; v < lp.size(); ++v) kl += std::exp(lp[v]) * (lp[v] - lq[v]);
      kl_sum += std::max(0.0, kl);
      agree += arg_max(oh.row(r)) == arg_max(ol.row(r)) ? 1 : 0;
      ++s.positions;
    }
  }
  if (s.positions > 0) {
    s.kl = kl_sum / s.positions;
    s.top1 = static_cast<double>(agree) / s.positions;
  }
  return s;
}

void ShadowScorer::run() {
  // The lowest priority for this thread alone: samples are scored with what the server leaves.
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
  ThreadPool pool(1);
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    auto s = score(*high_, *low_, job.tokens, job.n_prompt, pool);
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok()) {
      METRO_LOG_WARN("shadow scoring failed: %s", s.status().to_string().c_str());
      ++snap_.dropped;
      continue;
    }
    window_.push_back(*s);
    while (window_.size() > cfg_.window) window_.pop_front();
    double kl = 0.0, top1 = 0.0;
    for (const ShadowSample& w : window_) {
      kl += w.kl;
      top1 += w.top1;
    }
    ++snap_.scored;
    ++snap_.generation;
    snap_.in_window = window_.size();
    snap_.kl_mean = kl / static_cast<double>(window_.size());
    snap_.top1_mean = top1 / static_cast<double>(window_.size());
    snap_.last_kl = s->kl;
  }
}

}  // namespace metro::engine::adaptive
