// Server metrics and their Prometheus text exposition (format 0.0.4) at GET /metrics.
//
// HTTP-side series (requests by endpoint and status, TTFT / TPOT / end-to-end latency) are
// kept here; engine-side ones (queues, KV blocks, prefix cache, tokens, steps) are read from
// engine::EngineStats at scrape time. Every method is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "gateway/embed_batcher.h"
#include "sched/sched_metrics.h"

namespace metro::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);

  struct Snapshot {
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), then +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

// Writers for the text format. `name` must be a valid metric name; label values are escaped.
void write_metric_header(std::string* out, std::string_view name, std::string_view type, std::string_view help);
void write_sample(std::string* out, std::string_view name, std::string_view labels, double value);
void write_histogram(std::string* out, std::string_view name, std::string_view help, const std::vector<double>& bounds,
                     const std::vector<uint64_t>& cumulative, const double* sum, uint64_t count);
std::string escape_label_value(std::string_view v);
// Per-SLA-class series (label class="realtime|standard|batch").
void write_class_metrics(std::string* out, const sched::SchedMetricsSnapshot& s);

// The embeddings batching window (--embed-window): held / batches / submitted / cancelled
// counters, requests waiting, and each class's maximum wait.
void write_embed_window_metrics(std::string* out, const gateway::EmbedBatcher& window);

class ServerMetrics {
 public:
  ServerMetrics();

  // Endpoint labels are route paths metro knows (others count as "other"), so clients
  // cannot grow the label set.
  void count_request(std::string_view endpoint, int status);
  void observe_ttft(double seconds) { ttft_.observe(seconds); }
  void observe_tpot(double seconds) { tpot_.observe(seconds); }
  void observe_e2e(double seconds) { e2e_.observe(seconds); }

  std::atomic<int64_t> connections{0};        // open HTTP connections
  std::atomic<int64_t> inflight_requests{0};  // model requests between parse and last byte
  std::atomic<int64_t> inflight_choices{0};   // their choices (bounded by max_inflight_choices)
  std::atomic<uint64_t> rejected_connections{0};
  std::atomic<uint64_t> client_disconnects{0};  // requests aborted because the client left

  // The whole exposition. `stats` is null while the model loads; `per_class` (the
  // scheduler's SLA-class metrics) may be null.
  std::string render(const engine::EngineStats* stats, bool model_loaded, int64_t kv_capacity_tokens,
                     const sched::SchedMetricsSnapshot* per_class = nullptr) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  Histogram ttft_;
  Histogram tpot_;
  Histogram e2e_;
};

}  // namespace metro::server
