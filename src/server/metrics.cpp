#include "server/metrics.h"

#include <cmath>
#include <cstdio>

namespace metro::server {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  if (!std::isfinite(v)) return;
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  std::lock_guard<std::mutex> lock(mu_);
  s.cumulative.resize(counts_.size());
  uint64_t acc = 0;
  for (size_t i = 0; i < counts_.size(); ++i) s.cumulative[i] = acc += counts_[i];
  s.sum = sum_;
  s.count = count_;
  return s;
}

namespace {

std::vector<double> latency_bounds() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300};
}

constexpr const char* kKnownEndpoints[] = {
    "/", "/health", "/ready", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings"};

}  // namespace

ServerMetrics::ServerMetrics() : ttft_(latency_bounds()), tpot_(latency_bounds()), e2e_(latency_bounds()) {}

void ServerMetrics::count_request(std::string_view endpoint, int status) {
  std::string label = "other";
  for (const char* known : kKnownEndpoints) {
    if (endpoint == known) label = known;
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{label, status}];
}

void ServerMetrics::collect(metrics::Exposition& e) const {
  const char* requests_help = "HTTP requests answered, by endpoint and status.";
  e.declare("metro_http_requests_total", metrics::Type::kCounter, requests_help);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, n] : requests_) {
      e.counter("metro_http_requests_total", requests_help,
                metrics::labels({{"endpoint", key.first}, {"status", std::to_string(key.second)}}),
                static_cast<double>(n));
    }
  }
  e.gauge("metro_http_connections", "Open HTTP connections.", "", static_cast<double>(connections.load()));
  e.counter("metro_http_rejected_connections_total", "Connections refused over --max-connections.", "",
            static_cast<double>(rejected_connections.load()));
  e.counter("metro_client_disconnects_total", "Requests aborted because the client went away.", "",
            static_cast<double>(client_disconnects.load()));
  e.gauge("metro_inflight_requests", "Model requests being served (parsed, not yet fully answered).", "",
          static_cast<double>(inflight_requests.load()));
  auto hist = [&](const Histogram& h, const char* name, const char* help) {
    const Histogram::Snapshot s = h.snapshot();
    e.histogram(name, help, "", h.bounds(), s.cumulative, s.count, &s.sum);
  };
  hist(ttft_, "metro_time_to_first_token_seconds", "Time from a request's arrival to its first generated token.");
  hist(tpot_, "metro_time_per_output_token_seconds", "Mean time between generated tokens of a request.");
  hist(e2e_, "metro_e2e_request_latency_seconds", "Time from a request's arrival to its last event.");
}

}  // namespace metro::server
