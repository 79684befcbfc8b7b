#include "server/metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
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

std::vector<double> token_bounds() {
  return {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};
}

constexpr const char* kKnownEndpoints[] = {"/",
                                           "/ui",
                                           "/health",
                                           "/ready",
                                           "/metrics",
                                           "/v1/models",
                                           "/v1/models/{id}",
                                           "/v1/completions",
                                           "/v1/chat/completions",
                                           "/v1/embeddings",
                                           "/v1/responses",
                                           "/v1/responses/{id}",
                                           "/tokenize",
                                           "/detokenize",
                                           "/v1/feedback",
                                           "/admin"};

constexpr const char* kFinishReasons[] = {"stop", "length", "tool_calls", "abort"};

// What /proc says of this process: resident and virtual bytes, open descriptors.
struct ProcessSample {
  double resident_bytes = 0, virtual_bytes = 0, open_fds = 0;
};

ProcessSample sample_process() {
  ProcessSample s;
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    unsigned long long size = 0, resident = 0;
    if (std::fscanf(f, "%llu %llu", &size, &resident) == 2) {
      s.virtual_bytes = static_cast<double>(size) * page;
      s.resident_bytes = static_cast<double>(resident) * page;
    }
    std::fclose(f);
  }
  if (DIR* d = opendir("/proc/self/fd")) {
    int n = 0;
    while (const dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') ++n;
    }
    closedir(d);
    s.open_fds = n - 1;  // the directory being read
  }
  return s;
}

}  // namespace

ServerMetrics::ServerMetrics()
    : ttft_(latency_bounds()),
      tpot_(latency_bounds()),
      e2e_(latency_bounds()),
      queue_(latency_bounds()),
      prompt_tokens_(token_bounds()),
      generation_tokens_(token_bounds()),
      start_unix_s_(static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                            std::chrono::system_clock::now().time_since_epoch())
                                            .count()) *
                    1e-3) {}

void ServerMetrics::count_variant_request(const std::string& model, const std::string& variant, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++variant_requests_[{model, variant, status}];
}

void ServerMetrics::observe_call(int prompt_tokens, int completion_tokens, double queue_seconds,
                                 const std::vector<std::string>& finish_reasons) {
  prompt_tokens_.observe(prompt_tokens);
  generation_tokens_.observe(completion_tokens);
  if (queue_seconds >= 0) queue_.observe(queue_seconds);
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& r : finish_reasons) {
    if (r.empty()) continue;
    bool known = false;
    for (const char* k : kFinishReasons) known = known || r == k;
    ++finished_choices_[known ? r : "other"];
  }
}

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
  hist(queue_, "metro_request_queue_time_seconds",
       "Time a model call's requests waited in the engine's queue before a step first computed them.");
  hist(prompt_tokens_, "metro_request_prompt_tokens", "Prompt tokens of a model call (all its prompts).");
  hist(generation_tokens_, "metro_request_generation_tokens", "Tokens a model call generated (all its choices).");
  const char* variant_help = "Model requests answered, by model name, variant (primary or the variant) and status.";
  e.declare("metro_variant_requests_total", metrics::Type::kCounter, variant_help);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, n] : variant_requests_) {
      const auto& [model, variant, status] = key;
      e.counter("metro_variant_requests_total", variant_help,
                metrics::labels({{"model", model}, {"variant", variant}, {"status", std::to_string(status)}}),
                static_cast<double>(n));
    }
  }
  const char* finish_help = "Choices of model calls that ended, by finish reason.";
  e.declare("metro_choices_finished_total", metrics::Type::kCounter, finish_help);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [reason, n] : finished_choices_) {
      e.counter("metro_choices_finished_total", finish_help, metrics::labels({{"finish_reason", reason}}),
                static_cast<double>(n));
    }
  }
  // The process, under the names Prometheus client libraries use.
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                     static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  e.counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", "", cpu);
  const ProcessSample ps = sample_process();
  e.gauge("process_resident_memory_bytes", "Resident memory size in bytes.", "", ps.resident_bytes);
  e.gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", "", ps.virtual_bytes);
  e.gauge("process_open_fds", "Number of open file descriptors.", "", ps.open_fds);
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    e.gauge("process_max_fds", "Maximum number of open file descriptors.", "", static_cast<double>(rl.rlim_cur));
  }
  e.gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", "", start_unix_s_);
}

}  // namespace metro::server
