#include "sched/sched_metrics.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"

namespace metro::sched {

double HistogramSnapshot::quantile(double q) const {
  if (count == 0 || bounds.empty()) return 0.0;
  const double target = std::clamp(q, 0.0, 1.0) * static_cast<double>(count);
  double seen = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double c = static_cast<double>(counts[i]);
    if (c > 0.0 && seen + c >= target) {
      if (i >= bounds.size()) return bounds.back();
      const double lo = i == 0 ? 0.0 : bounds[i - 1];
      return lo + (bounds[i] - lo) * std::clamp((target - seen) / c, 0.0, 1.0);
    }
    seen += c;
  }
  return bounds.back();
}

Histogram::Histogram(std::vector<double> bounds) {
  METRO_CHECK(std::is_sorted(bounds.begin(), bounds.end()));
  s_.counts.assign(bounds.size() + 1, 0);
  s_.bounds = std::move(bounds);
}

void Histogram::observe(double v) {
  if (!std::isfinite(v)) return;
  const size_t i = static_cast<size_t>(
      std::lower_bound(s_.bounds.begin(), s_.bounds.end(), v) - s_.bounds.begin());
  ++s_.counts[i];
  s_.sum += v;
  ++s_.count;
}

std::vector<double> latency_buckets_s() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
          1.0,   1.5,    2.0,   3.0,  5.0,   7.5,  10.0,  15.0, 20.0, 30.0, 60.0, 120.0, 300.0};
}

SchedMetrics::PerClass::PerClass(int window)
    : ttft(latency_buckets_s()), tpot(latency_buckets_s()), e2e(latency_buckets_s()), accuracy(window) {}

SchedMetrics::SchedMetrics(const SlaConfig& sla, int predictor_window)
    : sla_(sla),
      classes_{PerClass(predictor_window), PerClass(predictor_window), PerClass(predictor_window)},
      accuracy_all_(predictor_window) {}

void SchedMetrics::observe_first_token(SlaClass c, double ttft_s) {
  std::lock_guard lock(mu_);
  of(c).ttft.observe(ttft_s);
}

void SchedMetrics::observe_finished(SlaClass c, double ttft_s, double tpot_s, double e2e_s) {
  std::lock_guard lock(mu_);
  PerClass& p = of(c);
  const SlaClassConfig& slo = sla_.of(c);
  if (tpot_s >= 0.0) p.tpot.observe(tpot_s);
  p.e2e.observe(e2e_s);
  const bool ttft_ok = ttft_s <= slo.ttft_s;
  const bool tpot_ok = tpot_s < 0.0 || tpot_s <= slo.tpot_s;
  ++p.finished;
  p.ttft_met += ttft_ok ? 1 : 0;
  p.tpot_met += tpot_ok ? 1 : 0;
  p.slo_met += ttft_ok && tpot_ok ? 1 : 0;
}

void SchedMetrics::set_queue_depth(SlaClass c, int64_t waiting, int64_t running) {
  std::lock_guard lock(mu_);
  of(c).waiting = waiting;
  of(c).running = running;
}


void SchedMetrics::observe_preemption(SlaClass c, bool fair_share) {
  std::lock_guard lock(mu_);
  ++of(c).preemptions;
  if (fair_share) ++of(c).fair_share_preemptions;
}

void SchedMetrics::observe_prediction(SlaClass c, double predicted_tokens, double actual_tokens) {
  std::lock_guard lock(mu_);
  of(c).accuracy.add(predicted_tokens, actual_tokens);
  accuracy_all_.add(predicted_tokens, actual_tokens);
}

SchedMetricsSnapshot SchedMetrics::snapshot() const {
  std::lock_guard lock(mu_);
  SchedMetricsSnapshot out;
  for (size_t i = 0; i < classes_.size(); ++i) {
    const PerClass& p = classes_[i];
    ClassMetricsSnapshot& s = out.classes[i];
    s.ttft_s = p.ttft.snapshot();
    s.tpot_s = p.tpot.snapshot();
    s.e2e_s = p.e2e.snapshot();
    s.finished = p.finished;
    s.ttft_met = p.ttft_met;
    s.tpot_met = p.tpot_met;
    s.slo_met = p.slo_met;
    s.slo_attainment = p.finished == 0 ? 0.0 : static_cast<double>(p.slo_met) / static_cast<double>(p.finished);
    s.waiting = p.waiting;
    s.running = p.running;
    s.preemptions = p.preemptions;
    s.fair_share_preemptions = p.fair_share_preemptions;
    s.predictor = p.accuracy.snapshot();
  }
  out.predictor = accuracy_all_.snapshot();
  return out;
}

}  // namespace metro::sched
