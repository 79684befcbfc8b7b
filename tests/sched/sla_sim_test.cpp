// The SLA scheduler in the simulated engine: properties that need time and load.
#include <gtest/gtest.h>

#include "sched/sim/engine_sim.h"
#include "sched/sim/scenarios.h"

namespace metro::sched::sim {
namespace {

// A realtime flood at twice what the engine can serve for 90 s, and one batch request at
// t = 5 s. Returns the batch request's TTFT.
double batch_ttft_under_realtime_flood(double batch_starve_s) {
  EngineSetup e;
  e.sla.of(SlaClass::kBatch).starve_s = batch_starve_s;
  e.sla.of(SlaClass::kBatch).starve_explicit = true;
  std::vector<TraceRequest> trace = poisson_trace(2.0 * capacity_rate(e, realtime_short, 1), 90.0, 3, realtime_short);
  TraceRequest b;
  b.arrival_s = 5.0;
  b.sla_class = SlaClass::kBatch;
  b.tenant = "batch";
  b.prompt_tokens = 512;
  b.output_tokens = 16;
  b.max_tokens = 16;
  trace = merge_traces(trace, {b});
  size_t idx = 0;
  while (trace[idx].sla_class != SlaClass::kBatch) ++idx;
  SimReport r = run_sim(trace, e.sim, sla_factory(e));
  EXPECT_TRUE(r.invariant_error.empty()) << r.invariant_error;
  EXPECT_FALSE(r.deadlock);
  EXPECT_TRUE(r.outcomes[idx].finished);
  return r.outcomes[idx].ttft_s;
}

TEST(SlaSim, BatchStarvationIsBoundedUnderARealtimeFlood) {
  // Documented bound: starve + the time to prefill its prompt in the lane (at most half of
  // each step's budget: 512 tokens at >= 23 a step of <= 0.125 s, about 3 s) + one step.
  const double starve = 20.0;
  const double ttft = batch_ttft_under_realtime_flood(starve);
  EXPECT_GE(ttft, starve * 0.9) << "realtime keeps strict preference until the bound";
  EXPECT_LE(ttft, starve + 4.0);
}

TEST(SlaSim, WithoutTheBoundBatchWaitsOutTheFlood) {
  // The same trace with starvation protection pushed out of reach: the batch request only
  // runs once the flood (90 s of arrivals at 2x capacity) has drained.
  const double ttft = batch_ttft_under_realtime_flood(kMaxSloSeconds);
  EXPECT_GT(ttft, 85.0);
}

TEST(SlaSim, BatchFloodDoesNotPushRealtimePastItsSlo) {
  // Batch arrives at 3x what the engine can serve; realtime requests arrive now and then.
  // Every realtime request must meet its TTFT and TPOT objectives; under FCFS none does.
  EngineSetup e;
  std::vector<TraceRequest> flood = poisson_trace(3.0 * capacity_rate(e, batch_long, 1), 300.0, 11, batch_long);
  std::vector<TraceRequest> rt = poisson_trace(0.1, 300.0, 12, realtime_short);
  std::vector<TraceRequest> trace = merge_traces(flood, rt);
  SimConfig sc = e.sim;
  sc.max_sim_s = 320.0;
  SimReport s = run_sim(trace, sc, sla_factory(e));
  SimReport f = run_sim(trace, sc, fcfs_factory(e));
  const int cls = static_cast<int>(SlaClass::kRealtime);
  int n_rt = 0;
  for (const auto& t : trace) n_rt += t.sla_class == SlaClass::kRealtime ? 1 : 0;
  ASSERT_GT(n_rt, 15);
  const LatencySummary ttft = summarize(ttfts(trace, s, cls));
  EXPECT_EQ(ttft.n, n_rt) << "every realtime request finished";
  EXPECT_LE(ttft.max, e.sla.of(SlaClass::kRealtime).ttft_s);
  EXPECT_LE(summarize(tpots(trace, s, cls)).max, e.sla.of(SlaClass::kRealtime).tpot_s);
  EXPECT_EQ(count_slo_met(trace, s, e.sla, cls), n_rt);
  EXPECT_LT(count_slo_met(trace, f, e.sla, cls), n_rt / 4);
  EXPECT_TRUE(s.invariant_error.empty()) << s.invariant_error;
}

TEST(SlaSim, MetricsRegistryIsFedBySimulatedTraffic) {
  EngineSetup e;
  SchedMetrics metrics(e.sla);
  std::vector<TraceRequest> trace = poisson_trace(0.5 * capacity_rate(e, chat_standard, 1), 200.0, 5, chat_standard);
  SimConfig sc = e.sim;
  sc.metrics = &metrics;
  SimReport r = run_sim(trace, sc, sla_factory(e, [&](SlaSchedulerConfig& c) { c.metrics = &metrics; }));
  SchedMetricsSnapshot snap = metrics.snapshot();
  const ClassMetricsSnapshot& st = snap.classes[static_cast<size_t>(SlaClass::kStandard)];
  EXPECT_EQ(st.finished, trace.size());
  EXPECT_EQ(st.ttft_s.count, trace.size());
  EXPECT_GT(st.slo_attainment, 0.9) << "half load: nearly everything meets its objectives";
  // The predictor learnt online: chat templates carry most of the output length.
  EXPECT_EQ(snap.predictor.n, std::min<int>(512, static_cast<int>(trace.size())));
  EXPECT_GT(snap.predictor.spearman, 0.6);
  EXPECT_GT(snap.predictor.within_100, 0.8);
  EXPECT_EQ(st.waiting + st.running, 0);
  EXPECT_TRUE(r.invariant_error.empty()) << r.invariant_error;
}

}  // namespace
}  // namespace metro::sched::sim
