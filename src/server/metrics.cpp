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

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.9g", v);
  }
  return buf;
}

std::vector<double> latency_bounds() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300};
}

constexpr const char* kKnownEndpoints[] = {
    "/", "/health", "/ready", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings"};

}  // namespace

std::string escape_label_value(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

void write_metric_header(std::string* out, std::string_view name, std::string_view type, std::string_view help) {
  *out += "# HELP ";
  *out += name;
  *out += ' ';
  *out += help;
  *out += "\n# TYPE ";
  *out += name;
  *out += ' ';
  *out += type;
  *out += '\n';
}

void write_sample(std::string* out, std::string_view name, std::string_view labels, double value) {
  *out += name;
  if (!labels.empty()) {
    *out += '{';
    *out += labels;
    *out += '}';
  }
  *out += ' ';
  *out += format_value(value);
  *out += '\n';
}

void write_histogram(std::string* out, std::string_view name, std::string_view help, const std::vector<double>& bounds,
                     const std::vector<uint64_t>& cumulative, const double* sum, uint64_t count) {
  write_metric_header(out, name, "histogram", help);
  const std::string bucket = std::string(name) + "_bucket";
  for (size_t i = 0; i < bounds.size() && i < cumulative.size(); ++i) {
    write_sample(out, bucket, "le=\"" + format_value(bounds[i]) + "\"", static_cast<double>(cumulative[i]));
  }
  write_sample(out, bucket, "le=\"+Inf\"", static_cast<double>(count));
  if (sum) write_sample(out, std::string(name) + "_sum", "", *sum);
  write_sample(out, std::string(name) + "_count", "", static_cast<double>(count));
}

ServerMetrics::ServerMetrics() : ttft_(latency_bounds()), tpot_(latency_bounds()), e2e_(latency_bounds()) {}

void ServerMetrics::count_request(std::string_view endpoint, int status) {
  std::string label = "other";
  for (const char* known : kKnownEndpoints) {
    if (endpoint == known) label = known;
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{label, status}];
}

void write_class_metrics(std::string* out, const sched::SchedMetricsSnapshot& s) {
  auto label = [](size_t c) {
    return std::string("class=\"") + sched::sla_class_name(static_cast<sched::SlaClass>(c)) + "\"";
  };
  auto hist = [&](const char* name, const char* help, auto member) {
    write_metric_header(out, name, "histogram", help);
    for (size_t c = 0; c < s.classes.size(); ++c) {
      const sched::HistogramSnapshot& h = s.classes[c].*member;
      uint64_t acc = 0;
      for (size_t i = 0; i < h.bounds.size() && i < h.counts.size(); ++i) {
        acc += h.counts[i];
        write_sample(out, std::string(name) + "_bucket", label(c) + ",le=\"" + format_value(h.bounds[i]) + "\"",
                     static_cast<double>(acc));
      }
      write_sample(out, std::string(name) + "_bucket", label(c) + ",le=\"+Inf\"", static_cast<double>(h.count));
      write_sample(out, std::string(name) + "_sum", label(c), h.sum);
      write_sample(out, std::string(name) + "_count", label(c), static_cast<double>(h.count));
    }
  };
  hist("metro_class_ttft_seconds", "Time to first token by SLA class.", &sched::ClassMetricsSnapshot::ttft_s);
  hist("metro_class_tpot_seconds", "Time per output token by SLA class.", &sched::ClassMetricsSnapshot::tpot_s);
  hist("metro_class_e2e_seconds", "End-to-end latency by SLA class.", &sched::ClassMetricsSnapshot::e2e_s);
  auto per_class = [&](const char* name, const char* type, const char* help, auto value) {
    write_metric_header(out, name, type, help);
    for (size_t c = 0; c < s.classes.size(); ++c) write_sample(out, name, label(c), value(s.classes[c]));
  };
  using C = sched::ClassMetricsSnapshot;
  per_class("metro_class_finished_total", "counter", "Requests finished, by SLA class.",
            [](const C& c) { return static_cast<double>(c.finished); });
  per_class("metro_class_slo_met_total", "counter", "Finished requests that met both TTFT and TPOT objectives.",
            [](const C& c) { return static_cast<double>(c.slo_met); });
  per_class("metro_class_slo_attainment", "gauge", "slo_met / finished.",
            [](const C& c) { return c.slo_attainment; });
  per_class("metro_class_waiting", "gauge", "Sequences waiting, by SLA class.",
            [](const C& c) { return static_cast<double>(c.waiting); });
  per_class("metro_class_running", "gauge", "Sequences running, by SLA class.",
            [](const C& c) { return static_cast<double>(c.running); });
  per_class("metro_class_preemptions_total", "counter", "Preemptions, by SLA class.",
            [](const C& c) { return static_cast<double>(c.preemptions); });
  per_class("metro_class_fair_share_preemptions_total", "counter",
            "Preemptions that gave a tenant below its share of seats one of another tenant's, by SLA class.",
            [](const C& c) { return static_cast<double>(c.fair_share_preemptions); });
  // The output-length predictor's accuracy over its recent window (sched::PredictionAccuracy),
  // per class and, without a class label, over all classes.
  auto predictor = [&](const char* name, const char* help, auto value) {
    write_metric_header(out, name, "gauge", help);
    for (size_t c = 0; c < s.classes.size(); ++c) write_sample(out, name, label(c), value(s.classes[c].predictor));
    write_sample(out, name, "", value(s.predictor));
  };
  using P = sched::PredictionAccuracy::Snapshot;
  predictor("metro_predictor_samples", "Finished requests in the output-length predictor's accuracy window.",
            [](const P& p) { return static_cast<double>(p.n); });
  predictor("metro_predictor_rank_correlation", "Spearman rank correlation of predicted vs actual output length.",
            [](const P& p) { return p.spearman; });
  predictor("metro_predictor_within_100_tokens", "Fraction of predictions within 100 tokens of the actual length.",
            [](const P& p) { return p.within_100; });
  predictor("metro_predictor_mean_abs_error_tokens", "Mean absolute error of predicted output length, in tokens.",
            [](const P& p) { return p.mean_abs_error; });
  write_metric_header(out, "metro_class_rejections_total", "counter", "Requests refused, by SLA class and reason.");
  for (size_t c = 0; c < s.classes.size(); ++c) {
    for (const auto& [reason, n] : s.classes[c].rejections) {
      write_sample(out, "metro_class_rejections_total", label(c) + ",reason=\"" + escape_label_value(reason) + "\"",
                   static_cast<double>(n));
    }
  }
}

void write_embed_window_metrics(std::string* out, const gateway::EmbedBatcher& window) {
  const gateway::EmbedBatcherStats s = window.stats();
  auto one = [&](const char* name, const char* type, const char* help, uint64_t v) {
    write_metric_header(out, name, type, help);
    write_sample(out, name, "", static_cast<double>(v));
  };
  one("metro_embed_window_held_total", "counter", "Embedding requests that entered the batching window.", s.held);
  one("metro_embed_window_batches_total", "counter", "Batches the window submitted to the engine.", s.batches);
  one("metro_embed_window_submitted_total", "counter", "Embedding inputs submitted in those batches.", s.submitted);
  one("metro_embed_window_cancelled_total", "counter", "Held requests whose client left before submission.",
      s.cancelled);
  one("metro_embed_window_waiting", "gauge", "Requests in the window now.", s.waiting);
  write_metric_header(out, "metro_embed_window_max_wait_seconds", "gauge",
                      "Longest an embedding request of a class waits for its batch.");
  for (int c = 0; c < sched::kNumSlaClasses; ++c) {
    const auto cls = static_cast<sched::SlaClass>(c);
    write_sample(out, "metro_embed_window_max_wait_seconds",
                 std::string("class=\"") + sched::sla_class_name(cls) + "\"", window.max_wait_s(cls));
  }
}

std::string ServerMetrics::render(const engine::EngineStats* st, bool model_loaded, int64_t kv_capacity_tokens,
                                  const sched::SchedMetricsSnapshot* per_class) const {
  std::string out;
  out.reserve(8192);
  write_metric_header(&out, "metro_http_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, n] : requests_) {
      write_sample(&out, "metro_http_requests_total",
                   "endpoint=\"" + escape_label_value(key.first) + "\",status=\"" + std::to_string(key.second) + "\"",
                   static_cast<double>(n));
    }
  }
  auto gauge = [&](const char* name, const char* help, double v) {
    write_metric_header(&out, name, "gauge", help);
    write_sample(&out, name, "", v);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    write_metric_header(&out, name, "counter", help);
    write_sample(&out, name, "", v);
  };
  gauge("metro_http_connections", "Open HTTP connections.", static_cast<double>(connections.load()));
  counter("metro_http_rejected_connections_total", "Connections refused over --max-connections.",
          static_cast<double>(rejected_connections.load()));
  counter("metro_client_disconnects_total", "Requests aborted because the client went away.",
          static_cast<double>(client_disconnects.load()));
  gauge("metro_inflight_requests", "Model requests being served (parsed, not yet fully answered).",
        static_cast<double>(inflight_requests.load()));
  auto hist = [&](const Histogram& h, const char* name, const char* help) {
    const Histogram::Snapshot s = h.snapshot();
    write_histogram(&out, name, help, h.bounds(), s.cumulative, &s.sum, s.count);
  };
  hist(ttft_, "metro_time_to_first_token_seconds", "Time from a request's arrival to its first generated token.");
  hist(tpot_, "metro_time_per_output_token_seconds", "Mean time between generated tokens of a request.");
  hist(e2e_, "metro_e2e_request_latency_seconds", "Time from a request's arrival to its last event.");
  gauge("metro_model_loaded", "1 once the model is loaded and requests are served.", model_loaded ? 1 : 0);
  if (st == nullptr) return out;

  gauge("metro_requests_waiting", "Sequences waiting to be scheduled.", st->waiting);
  gauge("metro_requests_running", "Sequences running (holding KV blocks).", st->running);
  gauge("metro_kv_blocks_used", "KV cache blocks referenced by sequences.", st->kv_blocks_used);
  gauge("metro_kv_blocks_total", "KV cache blocks in the pool.", st->kv_blocks_total);
  gauge("metro_kv_blocks_cached", "KV cache blocks holding prefix-cache entries.", st->kv_blocks_cached);
  gauge("metro_kv_capacity_tokens", "Tokens the KV cache holds.", static_cast<double>(kv_capacity_tokens));
  counter("metro_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
          static_cast<double>(st->prefix_queries));
  counter("metro_prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
          static_cast<double>(st->prefix_hits));
  counter("metro_prompt_tokens_total", "Prompt tokens computed (prefix-cache hits excluded).",
          static_cast<double>(st->prompt_tokens));
  counter("metro_generation_tokens_total", "Tokens generated.", static_cast<double>(st->generated_tokens));
  counter("metro_engine_steps_total", "Engine steps run.", static_cast<double>(st->steps));
  counter("metro_preemptions_total", "Sequences preempted (for KV space, or a tenant's fair share of seats).", static_cast<double>(st->preemptions));
  counter("metro_requests_finished_total", "Engine requests that finished.",
          static_cast<double>(st->requests_finished));
  counter("metro_requests_aborted_total", "Engine requests aborted.", static_cast<double>(st->requests_aborted));

  gauge("metro_sched_step_budget_tokens", "Token budget of the last engine step (the SLA policy cuts it to fit objectives).",
        st->step_budget_tokens);
  write_metric_header(&out, "metro_engine_step_cost_seconds", "gauge",
                      "Fitted step cost model: fixed, per token (prompt or decode), per prompt attention pair, "
                      "per key a decode reads (0 until fitted).");
  write_sample(&out, "metro_engine_step_cost_seconds", "term=\"fixed\"", st->cost_fixed_s);
  write_sample(&out, "metro_engine_step_cost_seconds", "term=\"per_prefill_token\"", st->cost_per_prefill_token_s);
  write_sample(&out, "metro_engine_step_cost_seconds", "term=\"per_decode_seq\"", st->cost_per_decode_seq_s);
  write_sample(&out, "metro_engine_step_cost_seconds", "term=\"per_attention_pair\"", st->cost_per_attention_pair_s);
  write_sample(&out, "metro_engine_step_cost_seconds", "term=\"per_decode_ctx\"", st->cost_per_decode_ctx_s);
  // Step time: the engine buckets milliseconds; exposed in seconds.
  std::vector<double> step_bounds;
  for (double b : engine::EngineStats::step_ms_bounds()) step_bounds.push_back(b * 1e-3);
  const double step_sum = st->step_seconds_total;
  write_histogram(&out, "metro_engine_step_duration_seconds", "Duration of an engine step.", step_bounds,
                  st->step_ms_buckets, &step_sum, st->steps);
  // The engine keeps no running sum of batch sizes, so this histogram has no _sum.
  write_histogram(&out, "metro_engine_batch_tokens", "Tokens in an engine step's batch.",
                  engine::EngineStats::batch_tokens_bounds(), st->batch_tokens_buckets, nullptr, st->steps);
  if (per_class) write_class_metrics(&out, *per_class);
  return out;
}

}  // namespace metro::server
