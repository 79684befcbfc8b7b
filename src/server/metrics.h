// The HTTP layer's series on GET /metrics: requests by endpoint and status, connections,
// TTFT / TPOT / end-to-end latency as clients saw them. Engines and the gateway register
// their own series in the same registry (base/metrics.h). Every method is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "base/metrics.h"

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

class ServerMetrics {
 public:
  ServerMetrics();

  // Endpoint labels are route paths metro knows (others count as "other"), so clients
  // cannot grow the label set.
  void count_request(std::string_view endpoint, int status);
  // A model request answered by `variant` ("primary" or a variant's name) of `model`.
  void count_variant_request(const std::string& model, const std::string& variant, int status);
  void observe_ttft(double seconds) { ttft_.observe(seconds); }
  void observe_tpot(double seconds) { tpot_.observe(seconds); }
  void observe_e2e(double seconds) { e2e_.observe(seconds); }
  // A model call that ended: its prompt and output lengths, its time in the engine's queue,
  // its choices' finish reasons.
  void observe_call(int prompt_tokens, int completion_tokens, double queue_seconds,
                    const std::vector<std::string>& finish_reasons);

  std::atomic<int64_t> connections{0};        // open HTTP connections
  std::atomic<int64_t> inflight_requests{0};  // model requests between parse and last byte
  std::atomic<uint64_t> rejected_connections{0};
  std::atomic<uint64_t> client_disconnects{0};  // requests aborted because the client left

  // Writes the series at scrape time (register it with metrics::Registry::add).
  void collect(metrics::Exposition& e) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> finished_choices_;  // by finish reason
  std::map<std::tuple<std::string, std::string, int>, uint64_t> variant_requests_;  // (model, variant, status)
  Histogram ttft_;
  Histogram tpot_;
  Histogram e2e_;
  Histogram queue_;
  Histogram prompt_tokens_;
  Histogram generation_tokens_;
  double start_unix_s_ = 0.0;
};

}  // namespace metro::server
