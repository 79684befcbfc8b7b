// Per-class metrics of one engine: latency histograms, SLO attainment, queue depth,
// preemptions, predictor accuracy. The engine and its scheduler observe into it; the
// engine's metrics collector formats snapshot(). Thread-safe (one short critical section
// per call); no text format here.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "sched/length_predictor.h"
#include "sched/seq_state.h"
#include "base/sla.h"

namespace metro::sched {

struct HistogramSnapshot {
  std::vector<double> bounds;    // upper bounds, increasing
  std::vector<uint64_t> counts;  // per bucket (not cumulative); the last is above bounds.back()
  double sum = 0.0;
  uint64_t count = 0;

  double mean() const { return count == 0 ? 0.0 : sum / static_cast<double>(count); }
  // Estimate from bucket counts (linear inside a bucket); the last bound for the overflow.
  double quantile(double q) const;
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  HistogramSnapshot snapshot() const { return s_; }

 private:
  HistogramSnapshot s_;
};

// Latency buckets in seconds, 1 ms to 300 s, about four per decade.
std::vector<double> latency_buckets_s();

struct ClassMetricsSnapshot {
  HistogramSnapshot ttft_s, tpot_s, e2e_s;
  uint64_t finished = 0;
  uint64_t ttft_met = 0, tpot_met = 0, slo_met = 0;  // slo_met: both objectives met
  double slo_attainment = 0.0;                        // slo_met / finished (0 when none)
  int64_t waiting = 0, running = 0;                   // the last set_queue_depth()
  uint64_t preemptions = 0;
  uint64_t fair_share_preemptions = 0;  // of which to give a tenant its share of seats
  PredictionAccuracy::Snapshot predictor;
};

struct SchedMetricsSnapshot {
  std::array<ClassMetricsSnapshot, kNumSlaClasses> classes;
  PredictionAccuracy::Snapshot predictor;  // over all classes
};

class SchedMetrics {
 public:
  explicit SchedMetrics(const SlaConfig& sla, int predictor_window = 512);

  // The first token of a request was emitted ttft_s after arrival.
  void observe_first_token(SlaClass c, double ttft_s);
  // A request finished normally. tpot_s < 0 when it produced fewer than two tokens (then
  // only TTFT counts towards its SLO).
  void observe_finished(SlaClass c, double ttft_s, double tpot_s, double e2e_s);
  void set_queue_depth(SlaClass c, int64_t waiting, int64_t running);
  // fair_share: to give a seat to a tenant below its share (else: for KV space).
  void observe_preemption(SlaClass c, bool fair_share = false);
  // A prediction made at admission and the length the request really produced.
  void observe_prediction(SlaClass c, double predicted_tokens, double actual_tokens);

  SchedMetricsSnapshot snapshot() const;
  const SlaConfig& sla() const { return sla_; }

 private:
  struct PerClass {
    Histogram ttft, tpot, e2e;
    uint64_t finished = 0, ttft_met = 0, tpot_met = 0, slo_met = 0;
    int64_t waiting = 0, running = 0;
    uint64_t preemptions = 0;
    uint64_t fair_share_preemptions = 0;
    PredictionAccuracy accuracy;
    PerClass(int window);
  };
  PerClass& of(SlaClass c) { return classes_[static_cast<size_t>(c)]; }

  SlaConfig sla_;
  mutable std::mutex mu_;
  std::array<PerClass, kNumSlaClasses> classes_;
  PredictionAccuracy accuracy_all_;
};

}  // namespace metro::sched
