#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "sched/length_predictor.h"
#include "sched/sched_metrics.h"

namespace metro::sched {
namespace {

LengthFeatures feat(uint64_t tpl, int max_new = 1024, int prompt = 100, SlaClass c = SlaClass::kStandard,
                    uint64_t tenant = 1) {
  return {.n_prompt = prompt, .max_new_tokens = max_new, .sla_class = c, .tenant_hash = tenant, .prefix_hash = tpl};
}

TEST(LengthPredictor, PriorWithoutHistory) {
  BucketQuantilePredictor p;
  LengthPrediction r = p.predict(feat(0, 200), 0);
  EXPECT_EQ(r.n_samples, 0);
  EXPECT_DOUBLE_EQ(r.mean_remaining, 100.0);
  EXPECT_DOUBLE_EQ(r.p90_remaining, 180.0);
  // Nothing may be generated any more.
  LengthPrediction none = p.predict(feat(0, 200), 200);
  EXPECT_DOUBLE_EQ(none.mean_remaining, 0.0);
}

TEST(LengthPredictor, LearnsPerTemplateAndConditionsOnProgress) {
  BucketQuantilePredictor p;
  for (int i = 0; i < 50; ++i) {
    p.observe(feat(1), 20 + i % 5);     // a short-answer template: 20..24
    p.observe(feat(2), 600 + 10 * (i % 10));  // a long one: 600..690
  }
  LengthPrediction s = p.predict(feat(1), 0);
  LengthPrediction l = p.predict(feat(2), 0);
  EXPECT_NEAR(s.mean_remaining, 22.0, 0.01);
  EXPECT_NEAR(l.mean_remaining, 645.0, 0.01);
  EXPECT_GE(s.n_samples, 8);
  EXPECT_LE(s.median_remaining, s.p90_remaining);
  // Having generated 622, the long template has mean (630+..+690)/7 - 622 = 38 to go.
  EXPECT_NEAR(p.predict(feat(2), 622).mean_remaining, 660.0 - 622.0, 0.01);
  // Past every sample of the template it falls back to coarser buckets, then the prior.
  LengthPrediction past = p.predict(feat(2, 1024), 700);
  EXPECT_EQ(past.n_samples, 0);
  EXPECT_DOUBLE_EQ(past.mean_remaining, (1024 - 700) / 2.0);
  // Predictions never exceed what max_tokens still allows.
  EXPECT_LE(p.predict(feat(2, 100), 0).mean_remaining, 100.0);
  EXPECT_EQ(p.version(), 100u);
}

TEST(LengthPredictor, UnknownTemplateUsesTenantAndLengthBuckets) {
  BucketQuantilePredictor p;
  for (int i = 0; i < 20; ++i) p.observe(feat(0, 64, 100, SlaClass::kRealtime, 7), 30);
  EXPECT_NEAR(p.predict(feat(0, 64, 120, SlaClass::kRealtime, 7), 0).mean_remaining, 30.0, 1e-9);
  // Another tenant with the same shape: the (class, prompt, max_tokens) bucket answers.
  EXPECT_NEAR(p.predict(feat(0, 64, 100, SlaClass::kRealtime, 8), 0).mean_remaining, 30.0, 1e-9);
}

TEST(LengthPredictor, SlidingWindowAdaptsAndBucketsAreCapped) {
  BucketQuantilePredictor p({.window = 16, .min_samples = 4, .max_buckets = 10});
  for (int i = 0; i < 16; ++i) p.observe(feat(5), 100);
  for (int i = 0; i < 16; ++i) p.observe(feat(5), 300);
  EXPECT_NEAR(p.predict(feat(5), 0).mean_remaining, 300.0, 1e-9) << "old lengths slid out";
  for (uint64_t t = 100; t < 1100; ++t) p.observe(feat(t, 1024, 100, SlaClass::kStandard, t), 50);
  EXPECT_LT(p.n_buckets(), 30u) << "fine buckets stop at the cap; coarse ones are few";
}

TEST(SpearmanRankCorrelation, KnownValues) {
  std::vector<double> a = {1, 2, 3, 4, 5};
  std::vector<double> up = {10, 20, 30, 40, 50};
  std::vector<double> down = {5, 4, 3, 2, 1};
  std::vector<double> monotone = {1, 4, 9, 16, 1000};
  EXPECT_NEAR(spearman_rank_correlation(a, up), 1.0, 1e-12);
  EXPECT_NEAR(spearman_rank_correlation(a, down), -1.0, 1e-12);
  EXPECT_NEAR(spearman_rank_correlation(a, monotone), 1.0, 1e-12);
  // With ties: x = (1,2,2,3), y = (1,2,3,4) -> ranks (1,2.5,2.5,4) vs (1,2,3,4): r = 0.9487.
  std::vector<double> x = {1, 2, 2, 3}, y = {1, 2, 3, 4};
  EXPECT_NEAR(spearman_rank_correlation(x, y), 3.0 * std::sqrt(10.0) / 10.0, 1e-9);
  std::vector<double> flat = {3, 3, 3, 3};
  EXPECT_EQ(spearman_rank_correlation(flat, y), 0.0);
}

TEST(PredictionAccuracy, WindowedRankAndWithin100) {
  PredictionAccuracy acc(4);
  acc.add(10, 50);    // within 100
  acc.add(500, 100);  // off by 400
  acc.add(200, 250);  // within
  acc.add(900, 700);  // off by 200
  PredictionAccuracy::Snapshot s = acc.snapshot();
  EXPECT_EQ(s.n, 4);
  EXPECT_DOUBLE_EQ(s.within_100, 0.5);
  EXPECT_DOUBLE_EQ(s.mean_abs_error, (40 + 400 + 50 + 200) / 4.0);
  EXPECT_NEAR(s.spearman, 0.8, 1e-12);  // ranks (1,3,2,4) vs (1,2,3,4)
  acc.add(1, 1);  // replaces the oldest pair
  EXPECT_EQ(acc.snapshot().n, 4);
}

TEST(SchedMetrics, HistogramsAttainmentQueues) {
  SlaConfig sla;
  SchedMetrics m(sla);
  m.observe_first_token(SlaClass::kRealtime, 0.2);
  m.observe_finished(SlaClass::kRealtime, 0.2, 0.05, 1.0);   // meets both
  m.observe_finished(SlaClass::kRealtime, 0.9, 0.05, 2.0);   // TTFT missed
  m.observe_finished(SlaClass::kRealtime, 0.3, 0.5, 3.0);    // TPOT missed
  m.observe_finished(SlaClass::kRealtime, 0.3, -1.0, 0.3);   // one token: TTFT only
  m.set_queue_depth(SlaClass::kStandard, 7, 3);
  m.observe_preemption(SlaClass::kBatch);
  SchedMetricsSnapshot s = m.snapshot();
  const ClassMetricsSnapshot& rt = s.classes[0];
  EXPECT_EQ(rt.finished, 4u);
  EXPECT_EQ(rt.slo_met, 2u);
  EXPECT_EQ(rt.ttft_met, 3u);
  EXPECT_EQ(rt.tpot_met, 3u);
  EXPECT_DOUBLE_EQ(rt.slo_attainment, 0.5);
  EXPECT_EQ(rt.ttft_s.count, 1u);
  EXPECT_EQ(rt.tpot_s.count, 3u);
  EXPECT_EQ(rt.e2e_s.count, 4u);
  EXPECT_NEAR(rt.e2e_s.sum, 6.3, 1e-12);
  EXPECT_EQ(s.classes[2].preemptions, 1u);
  EXPECT_EQ(s.classes[1].waiting, 7);
  EXPECT_EQ(s.classes[1].running, 3);
}

TEST(Histogram, BucketsAndQuantiles) {
  Histogram h({1.0, 2.0, 4.0});
  for (double v : {0.5, 1.0, 1.5, 3.0, 10.0}) h.observe(v);
  h.observe(std::nan(""));
  HistogramSnapshot s = h.snapshot();
  EXPECT_EQ(s.count, 5u);
  EXPECT_EQ(s.counts, (std::vector<uint64_t>{2, 1, 1, 1}));  // <=1, <=2, <=4, above
  EXPECT_NEAR(s.quantile(0.4), 1.0, 1e-12);   // 2 of 5 are <= 1
  EXPECT_NEAR(s.quantile(0.5), 1.5, 1e-12);   // half way through the (1, 2] bucket
  EXPECT_DOUBLE_EQ(s.quantile(1.0), 4.0);     // overflow reports the last bound
  EXPECT_DOUBLE_EQ(s.mean(), 16.0 / 5.0);
}

}  // namespace
}  // namespace metro::sched
