#include "loadgen/stats.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "loadgen/classes.h"

namespace metro::loadgen {

double percentile_sorted(std::span<const double> sorted, double p) {
  METRO_CHECK(p >= 0.0 && p <= 100.0);
  if (sorted.empty()) return kNotMeasured;
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(std::floor(rank));
  if (i + 1 >= sorted.size()) return sorted.back();
  const double f = rank - static_cast<double>(i);
  return sorted[i] + f * (sorted[i + 1] - sorted[i]);
}

Distribution Distribution::of(std::vector<double> values) {
  std::erase_if(values, [](double v) { return std::isnan(v); });
  Distribution d;
  d.n = values.size();
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  double sum = 0.0;
  for (double v : values) sum += v;
  d.mean = sum / static_cast<double>(values.size());
  d.p50 = percentile_sorted(values, 50);
  d.p90 = percentile_sorted(values, 90);
  d.p99 = percentile_sorted(values, 99);
  d.min = values.front();
  d.max = values.back();
  return d;
}

namespace {

// name empty: every request.
GroupSummary summarize_group(const RunResult& run, const SloSet& slos, const std::string& name) {
  GroupSummary g;
  g.name = name.empty() ? "all" : name;
  std::vector<double> ttft, tpot, itl, e2e, queue;
  double words = 0.0;
  size_t n_words = 0;
  for (const auto& r : run.requests) {
    if (!name.empty() && r.class_name != name) continue;
    ++g.n_requests;
    queue.push_back(r.queue_s());
    if (r.input_words > 0) {
      words += static_cast<double>(r.input_words);
      ++n_words;
    }
    if (slos.any()) {
      if (slos.for_class(r.class_name).met_by(r)) ++g.n_good;
    }
    if (!r.ok()) {
      ++g.n_failed;
      ++g.errors[r.error];
      continue;
    }
    ++g.n_ok;
    if (r.prompt_tokens >= 0) {
      g.prompt_tokens += r.prompt_tokens;
      ++g.n_prompt_reported;
    }
    if (r.cached_tokens >= 0) {
      g.cached_tokens += r.cached_tokens;
      ++g.n_cached_reported;
    }
    g.completion_tokens += r.completion_tokens;
    if (r.usage_reported) ++g.n_usage_reported;
    ttft.push_back(r.ttft_s);
    tpot.push_back(r.tpot_s);
    e2e.push_back(r.e2e_s);
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
  }
  g.mean_input_words = n_words > 0 ? words / static_cast<double>(n_words) : 0.0;
  g.ttft = Distribution::of(std::move(ttft));
  g.tpot = Distribution::of(std::move(tpot));
  g.itl = Distribution::of(std::move(itl));
  g.e2e = Distribution::of(std::move(e2e));
  g.queue = Distribution::of(std::move(queue));
  if (run.duration_s > 0.0) {
    g.request_throughput = static_cast<double>(g.n_ok) / run.duration_s;
    g.output_token_throughput = static_cast<double>(g.completion_tokens) / run.duration_s;
    g.total_token_throughput =
        static_cast<double>(g.completion_tokens + g.prompt_tokens) / run.duration_s;
  }
  g.has_slo = slos.any();
  if (!name.empty()) g.slo = slos.for_class(name);
  if (g.has_slo) {
    g.goodput = run.duration_s > 0.0 ? static_cast<double>(g.n_good) / run.duration_s : 0.0;
    g.good_fraction = g.n_requests > 0 ? static_cast<double>(g.n_good) / static_cast<double>(g.n_requests) : 0.0;
  }
  return g;
}

}  // namespace

RunSummary summarize(const RunResult& run, const SloSet& slos) {
  RunSummary s;
  s.rate_per_s = run.rate_per_s;
  s.duration_s = run.duration_s;
  s.peak_in_flight = run.peak_in_flight;
  s.overall = summarize_group(run, slos, "");
  std::set<std::string> names;
  for (const auto& r : run.requests) names.insert(r.class_name);
  if (!(names.size() == 1 && *names.begin() == kDefaultClass)) {
    for (const auto& n : names) s.classes.push_back(summarize_group(run, slos, n));
  }
  s.overall.slo = s.classes.empty() ? slos.for_class(kDefaultClass) : slos.all_classes();
  return s;
}

std::vector<double> pooled_itl(std::span<const RequestRecord> requests, const std::string& class_name) {
  std::vector<double> out;
  for (const auto& r : requests) {
    if (!r.ok() || (!class_name.empty() && r.class_name != class_name)) continue;
    out.insert(out.end(), r.itl_s.begin(), r.itl_s.end());
  }
  return out;
}

}  // namespace metro::loadgen
