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

// Per-token activation statistics of one layer's output, summed over tokens.
struct LayerStats {
  double rms = 0.0, max_abs = 0.0;
  int tokens = 0;
  void add(const float* x, size_t n) {
    double ss = 0.0, mx = 0.0;
    for (size_t i = 0; i < n; ++i) {
      ss += static_cast<double>(x[i]) * x[i];
      mx = std::max(mx, static_cast<double>(std::fabs(x[i])));
    }
    rms += std::sqrt(ss / static_cast<double>(n));
    max_abs += mx;
    ++tokens;
  }
};

double log_ratio(double a, double b) {
  constexpr double kTiny = 1e-30;
  return std::fabs(std::log((a + kTiny) / (b + kTiny)));
}

// One tier over the whole sequence, chunk by chunk: the logits rows of the output positions
// (appended to `rows`, n_vocab each) and, through a layer chain, each layer's statistics.
class TierPass {
 public:
  TierPass(const model::Model& m, const LayerChain* chain, int n, int n_ctx) : m_(m), chain_(chain) {
    model::WorkspaceLimits lim;
    lim.n_ctx = n_ctx;
    lim.max_tokens = kChunk;
    lim.max_logits = kChunk;
    lim.max_seqs = 1;
    lim.max_blocks_per_seq = (n + 15) / 16 + 1;
    if (chain_ == nullptr) {
      ws_.push_back(m.make_workspace(lim));
      kv_.push_back(std::make_unique<model::SequenceKv>(m, n));
      return;
    }
    for (const auto& layer : chain_->layers) {
      ws_.push_back(layer->make_workspace(lim));
      kv_.push_back(std::make_unique<model::SequenceKv>(*layer, n));
    }
    stats_.resize(chain_->layers.size() - 1);
  }

  Expected<model::ForwardOutput> run(const model::Batch& b, ThreadPool& pool) {
    if (chain_ == nullptr) return m_.forward(b, kv_[0]->view(), ws_[0], pool);
    const size_t n_embd = m_.hparams().n_embd;
    const size_t L = chain_->layers.size();
    for (size_t l = 0; l < L; ++l) {
      const model::Model& layer = *chain_->layers[l];
      auto out = l == 0 ? layer.forward(b, kv_[l]->view(), ws_[l], pool)
                        : layer.forward(b, residual_, kv_[l]->view(), ws_[l], pool);
      if (!out.ok() || l + 1 == L) return out;
      residual_.assign(out->residual, out->residual + static_cast<size_t>(b.size()) * n_embd);
      for (int t = 0; t < b.size(); ++t) stats_[l].add(residual_.data() + static_cast<size_t>(t) * n_embd, n_embd);
    }
    return internal_error("unreachable");
  }
  const std::vector<LayerStats>& stats() const { return stats_; }

 private:
  const model::Model& m_;
  const LayerChain* chain_;
  std::vector<model::Workspace> ws_;
  std::vector<std::unique_ptr<model::SequenceKv>> kv_;
  std::vector<float> residual_;
  std::vector<LayerStats> stats_;
};

}  // namespace

Expected<LayerChain> LayerChain::of(const model::Model& m) {
  LayerChain c;
  const int L = static_cast<int>(m.hparams().n_layer);
  if (!m.shard().starts_model() || !m.shard().ends_model || m.shard().sliced() || L < 2) {
    return invalid_argument("a layer chain needs a whole model of two layers or more");
  }
  if (m.file_given_back() > 0) {
    return invalid_argument("a layer chain reads the model's file, whose copy was given back after loading");
  }
  for (int l = 0; l < L; ++l) {
    METRO_ASSIGN_OR_RETURN(gguf::File view, gguf::File::parse(m.file().bytes()));
    model::ModelOptions opts;
    opts.allow_repack = false;  // read the tier's weights in place: no copy
    opts.backend = m.backend();
    opts.shard.layer_begin = l;
    opts.shard.layer_end = l + 1;
    METRO_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> layer, model::Model::from_file(std::move(view), opts));
    c.layers.push_back(std::move(layer));
  }
  return c;
}

ShadowScorer::ShadowScorer(std::shared_ptr<const model::Model> high, std::shared_ptr<const model::Model> low,
                           ShadowConfig config)
    : high_(std::move(high)), low_(std::move(low)), cfg_(config) {
  if (cfg_.every > 0 && cfg_.layer_drift) {
    auto hc = LayerChain::of(*high_);
    auto lc = LayerChain::of(*low_);
    if (hc.ok() && lc.ok()) {
      high_chain_ = std::move(*hc);
      low_chain_ = std::move(*lc);
    } else {
      METRO_LOG_WARN("shadow scoring without per-layer drift: %s",
                     (hc.ok() ? lc.status() : hc.status()).to_string().c_str());
    }
  }
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

std::vector<ShadowSample> ShadowScorer::recent(size_t n) const {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t k = std::min(n, window_.size());
  return std::vector<ShadowSample>(window_.end() - static_cast<long>(k), window_.end());
}

void ShadowScorer::reset_window() {
  std::lock_guard<std::mutex> lock(mu_);
  window_.clear();
  snap_.in_window = 0;
  snap_.kl_mean = 0.0;
  snap_.top1_mean = 0.0;
  snap_.layer_drift.clear();
}

Expected<ShadowSample> ShadowScorer::score(const model::Model& high, const model::Model& low,
                                           std::span<const int32_t> tokens, int n_prompt, ThreadPool& pool,
                                           const LayerChain* high_chain, const LayerChain* low_chain, int n_ctx) {
  const int n = static_cast<int>(tokens.size());
  if (n_prompt < 1 || n <= n_prompt) return invalid_argument("shadow score: no output to score");
  const bool chains = high_chain != nullptr && low_chain != nullptr &&
                      high_chain->layers.size() == low_chain->layers.size() && high_chain->layers.size() >= 2;
  TierPass ph(high, chains ? high_chain : nullptr, n, n_ctx), pl(low, chains ? low_chain : nullptr, n, n_ctx);
  ShadowSample s;
  double kl_sum = 0.0;
  int agree = 0;
  std::vector<double> lp, lq;
  for (int start = 0; start < n - 1; start += kChunk) {
    const int end = std::min(n - 1, start + kChunk);
    model::Batch b;
    // Logits of position i predict token i + 1: the output positions are [n_prompt - 1, n - 1).
    for (int i = start; i < end; ++i) b.add(tokens[static_cast<size_t>(i)], i, 0, i >= n_prompt - 1);
    // Each pass has workspaces of its own: both outputs stay valid together.
    METRO_ASSIGN_OR_RETURN(model::ForwardOutput oh, ph.run(b, pool));
    METRO_ASSIGN_OR_RETURN(model::ForwardOutput ol, pl.run(b, pool));
    for (int r = 0; r < ol.n_rows; ++r) {
      const std::span<const float> hr = oh.row(r);
      log_softmax(hr, lp);
      log_softmax(ol.row(r), lq);
      double kl = 0.0;
      for (size_t v = 0; v < lp.size(); ++v) kl += std::exp(lp[v]) * (lp[v] - lq[v]);
      kl_sum += std::max(0.0, kl);
      agree += arg_max(hr) == arg_max(ol.row(r)) ? 1 : 0;
      ++s.positions;
    }
  }
  if (s.positions > 0) {
    s.kl = kl_sum / s.positions;
    s.top1 = static_cast<double>(agree) / s.positions;
  }
  if (chains) {
    for (size_t l = 0; l < ph.stats().size(); ++l) {
      const LayerStats& a = ph.stats()[l];
      const LayerStats& c = pl.stats()[l];
      s.drift.push_back(0.5 * (log_ratio(c.rms, a.rms) + log_ratio(c.max_abs, a.max_abs)));
    }
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
    auto s = score(*high_, *low_, job.tokens, job.n_prompt, pool, high_chain_ ? &*high_chain_ : nullptr,
                   low_chain_ ? &*low_chain_ : nullptr, cfg_.n_ctx);
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
    snap_.layer_drift.clear();
    for (const ShadowSample& w : window_) {
      if (w.drift.empty()) continue;
      if (snap_.layer_drift.empty()) snap_.layer_drift.assign(w.drift.size(), 0.0);
      for (size_t l = 0; l < w.drift.size() && l < snap_.layer_drift.size(); ++l) {
        snap_.layer_drift[l] += w.drift[l] / static_cast<double>(window_.size());
      }
    }
  }
}

}  // namespace metro::engine::adaptive
