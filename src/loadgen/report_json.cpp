#include "loadgen/report_json.h"

#include <cmath>

namespace metro::loadgen {
namespace {

using nlohmann::json;

json number_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json dist_to_json(const Distribution& d) {
  return {{"n", d.n},
          {"mean", number_or_null(d.mean)},
          {"p50", number_or_null(d.p50)},
          {"p90", number_or_null(d.p90)},
          {"p99", number_or_null(d.p99)},
          {"min", number_or_null(d.min)},
          {"max", number_or_null(d.max)}};
}

json slo_to_json(const Slo& s) {
  json j = json::object();
  if (s.ttft_s) j["ttft_s"] = *s.ttft_s;
  if (s.tpot_s) j["tpot_s"] = *s.tpot_s;
  if (s.itl_s) j["itl_s"] = *s.itl_s;
  if (s.e2e_s) j["e2e_s"] = *s.e2e_s;
  return j;
}

}  // namespace

json group_to_json(const GroupSummary& g) {
  json errors = json::object();
  for (const auto& [k, n] : g.errors) errors[k] = n;
  json j;
  j["requests"] = g.n_requests;
  j["ok"] = g.n_ok;
  j["failed"] = g.n_failed;
  j["errors_by_status"] = errors;
  j["input_tokens"] = {
      {"total", g.n_prompt_reported > 0 ? json(g.prompt_tokens) : json(nullptr)},
      {"requests_reporting", g.n_prompt_reported},
      {"mean", g.n_prompt_reported > 0
                   ? json(static_cast<double>(g.prompt_tokens) / static_cast<double>(g.n_prompt_reported))
                   : json(nullptr)},
      {"mean_words_asked", g.mean_input_words},
      {"cached", g.n_cached_reported > 0 ? json(g.cached_tokens) : json(nullptr)}};
  j["output_tokens"] = {
      {"total", g.completion_tokens},
      {"mean", g.n_ok > 0 ? json(static_cast<double>(g.completion_tokens) / static_cast<double>(g.n_ok))
                          : json(nullptr)},
      {"from_usage", g.n_usage_reported}};
  j["throughput"] = {{"requests_per_s", g.request_throughput},
                     {"output_tokens_per_s", g.output_token_throughput},
                     {"total_tokens_per_s", g.total_token_throughput}};
  j["ttft_s"] = dist_to_json(g.ttft);
  j["tpot_s"] = dist_to_json(g.tpot);
  j["itl_s"] = dist_to_json(g.itl);
  j["e2e_s"] = dist_to_json(g.e2e);
  j["queue_s"] = dist_to_json(g.queue);
  if (g.has_slo) {
    j["goodput"] = {{"slo", slo_to_json(g.slo)},
                    {"good_requests", g.n_good},
                    {"requests_per_s", g.goodput},
                    {"fraction", g.good_fraction}};
  } else {
    j["goodput"] = nullptr;
  }
  return j;
}

json request_to_json(const RequestRecord& r) {
  return {{"session", r.session},
          {"turn", r.turn},
          {"class", r.class_name},
          {"http_status", r.http_status},
          {"error", r.ok() ? json(nullptr) : json(r.error)},
          {"error_detail", r.error_detail.empty() ? json(nullptr) : json(r.error_detail)},
          {"input_words", r.input_words},
          {"max_tokens", r.max_tokens},
          {"scheduled_s", r.scheduled_s},
          {"sent_s", r.sent_s},
          {"done_s", r.done_s},
          {"ttft_s", number_or_null(r.ttft_s)},
          {"tpot_s", number_or_null(r.tpot_s)},
          {"e2e_s", number_or_null(r.e2e_s)},
          {"max_itl_s", number_or_null(r.max_itl_s())},
          {"prompt_tokens", r.prompt_tokens >= 0 ? json(r.prompt_tokens) : json(nullptr)},
          {"cached_tokens", r.cached_tokens >= 0 ? json(r.cached_tokens) : json(nullptr)},
          {"completion_tokens", r.completion_tokens},
          {"usage_reported", r.usage_reported},
          {"content_chunks", r.n_content_chunks},
          {"finish_reason", r.finish_reason.empty() ? json(nullptr) : json(r.finish_reason)}};
}

json run_to_json(const RunSummary& s, const RunResult& run) {
  json j;
  j["rate_per_s"] = number_or_null(s.rate_per_s);
  j["duration_s"] = s.duration_s;
  j["peak_in_flight"] = s.peak_in_flight;
  j["http"] = {{"connections_opened", run.http.connections_opened},
               {"connections_reused", run.http.connections_reused},
               {"stale_retries", run.http.stale_retries}};
  j["overall"] = group_to_json(s.overall);
  json classes = json::object();
  for (const auto& c : s.classes) classes[c.name] = group_to_json(c);
  j["classes"] = classes;
  json reqs = json::array();
  for (const auto& r : run.requests) reqs.push_back(request_to_json(r));
  j["requests"] = std::move(reqs);
  return j;
}

json report_to_json(const json& config, std::span<const RunSummary> summaries,
                    std::span<const RunResult> runs) {
  METRO_CHECK(summaries.size() == runs.size());
  json j;
  j["tool"] = "metro bench-serve";
  j["schema_version"] = kJsonSchemaVersion;
  j["config"] = config;
  json arr = json::array();
  for (size_t i = 0; i < runs.size(); ++i) arr.push_back(run_to_json(summaries[i], runs[i]));
  j["runs"] = std::move(arr);
  return j;
}

}  // namespace metro::loadgen
