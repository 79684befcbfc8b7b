#include "loadgen/stats.h"

#include <gtest/gtest.h>

#include <cmath>

#include "loadgen/slo.h"

namespace metro::loadgen {
namespace {

TEST(LoadgenStats, PercentilesByLinearInterpolation) {
  // Hand-computed: rank = p/100 * (n-1); values 1..10 in scrambled order.
  Distribution d = Distribution::of({7, 3, 10, 1, 5, 9, 2, 8, 6, 4});
  EXPECT_EQ(d.n, 10u);
  EXPECT_DOUBLE_EQ(d.mean, 5.5);
  EXPECT_DOUBLE_EQ(d.p50, 5.5);   // rank 4.5: 5 + 0.5 * (6 - 5)
  EXPECT_DOUBLE_EQ(d.p90, 9.1);   // rank 8.1: 9 + 0.1 * (10 - 9)
  EXPECT_DOUBLE_EQ(d.p99, 9.91);  // rank 8.91
  EXPECT_DOUBLE_EQ(d.min, 1);
  EXPECT_DOUBLE_EQ(d.max, 10);

  const double two[] = {1.0, 3.0};
  EXPECT_DOUBLE_EQ(percentile_sorted(two, 90), 2.8);  // rank 0.9: 1 + 0.9 * 2
  EXPECT_DOUBLE_EQ(percentile_sorted(two, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile_sorted(two, 100), 3.0);
  const double one[] = {0.25};
  EXPECT_DOUBLE_EQ(percentile_sorted(one, 99), 0.25);
  EXPECT_TRUE(std::isnan(percentile_sorted({}, 50)));
}

TEST(LoadgenStats, DistributionSkipsUnmeasured) {
  Distribution d = Distribution::of({kNotMeasured, 2.0, kNotMeasured, 4.0});
  EXPECT_EQ(d.n, 2u);
  EXPECT_DOUBLE_EQ(d.mean, 3.0);
  EXPECT_DOUBLE_EQ(d.p50, 3.0);
  Distribution e = Distribution::of({kNotMeasured});
  EXPECT_EQ(e.n, 0u);
  EXPECT_TRUE(std::isnan(e.p99));
}

RequestRecord make(const std::string& cls, double ttft, double tpot, int64_t out_tokens,
                   std::string error = "") {
  RequestRecord r;
  r.class_name = cls;
  r.ttft_s = ttft;
  r.tpot_s = tpot;
  r.e2e_s = std::isnan(ttft) ? kNotMeasured : ttft + tpot * static_cast<double>(out_tokens - 1);
  r.completion_tokens = out_tokens;
  r.prompt_tokens = 10;
  r.usage_reported = true;
  r.error = std::move(error);
  if (!r.error.empty()) {
    r.e2e_s = kNotMeasured;
    r.http_status = std::atoi(r.error.c_str());
  }
  return r;
}

TEST(LoadgenStats, GoodputPerClassAgainstHandCount) {
  auto slos = SloSet::parse({"ttft=0.5", "realtime:ttft=0.2,tpot=0.05"});
  ASSERT_TRUE(slos.ok()) << slos.status().message();
  RunResult run;
  run.duration_s = 2.0;
  run.rate_per_s = 4.0;
  run.requests = {
      make("realtime", 0.1, 0.04, 11),  // good
      make("realtime", 0.3, 0.04, 11),  // TTFT above realtime's 0.2
      make("realtime", 0.1, 0.06, 11),  // TPOT above 0.05
      make("batch", 0.4, 1.00, 11),     // good: batch has only the all-class ttft <= 0.5
      make("batch", kNotMeasured, kNotMeasured, 0, "503"),
      make("batch", 0.6, 0.01, 11),  // TTFT above 0.5
  };
  RunSummary s = summarize(run, *slos);
  EXPECT_EQ(s.overall.n_requests, 6u);
  EXPECT_EQ(s.overall.n_ok, 5u);
  EXPECT_EQ(s.overall.n_failed, 1u);
  EXPECT_EQ(s.overall.errors.at("503"), 1u);
  EXPECT_EQ(s.overall.n_good, 2u);
  EXPECT_DOUBLE_EQ(s.overall.goodput, 1.0);  // 2 good / 2 s
  EXPECT_DOUBLE_EQ(s.overall.good_fraction, 2.0 / 6.0);
  EXPECT_DOUBLE_EQ(s.overall.request_throughput, 2.5);         // 5 ok / 2 s
  EXPECT_DOUBLE_EQ(s.overall.output_token_throughput, 27.5);   // 55 tokens / 2 s
  EXPECT_DOUBLE_EQ(s.overall.total_token_throughput, 52.5);    // (55 + 50) / 2 s
  ASSERT_EQ(s.classes.size(), 2u);
  const GroupSummary& batch = s.classes[0];
  const GroupSummary& realtime = s.classes[1];
  EXPECT_EQ(batch.name, "batch");
  EXPECT_EQ(realtime.name, "realtime");
  EXPECT_EQ(realtime.n_good, 1u);
  EXPECT_EQ(batch.n_good, 1u);
  EXPECT_DOUBLE_EQ(realtime.goodput, 0.5);
  EXPECT_DOUBLE_EQ(batch.good_fraction, 1.0 / 3.0);
  EXPECT_EQ(batch.errors.at("503"), 1u);
  EXPECT_DOUBLE_EQ(*realtime.slo.ttft_s, 0.2);
  EXPECT_DOUBLE_EQ(*realtime.slo.tpot_s, 0.05);
  EXPECT_DOUBLE_EQ(*batch.slo.ttft_s, 0.5);
  EXPECT_FALSE(batch.slo.tpot_s.has_value());
  // Realtime TTFTs 0.1, 0.3, 0.1: p50 0.1, mean 0.5/3.
  EXPECT_DOUBLE_EQ(realtime.ttft.p50, 0.1);
  EXPECT_NEAR(realtime.ttft.mean, 0.5 / 3.0, 1e-12);
}

TEST(LoadgenStats, NoSloMeansNoGoodput) {
  RunResult run;
  run.duration_s = 1.0;
  run.requests = {make("default", 0.1, 0.01, 3)};
  RunSummary s = summarize(run, SloSet());
  EXPECT_FALSE(s.overall.has_slo);
  EXPECT_EQ(s.overall.n_good, 0u);
  EXPECT_TRUE(s.classes.empty());  // only the default class: no per-class table
}

TEST(LoadgenStats, ItlPooledAcrossRequests) {
  RunResult run;
  run.duration_s = 1.0;
  RequestRecord a = make("default", 0.1, 0.01, 3), b = make("default", 0.1, 0.01, 3);
  a.itl_s = {0.01, 0.03};
  b.itl_s = {0.02};
  run.requests = {a, b};
  RunSummary s = summarize(run, SloSet());
  EXPECT_EQ(s.overall.itl.n, 3u);
  EXPECT_DOUBLE_EQ(s.overall.itl.p50, 0.02);
  EXPECT_DOUBLE_EQ(s.overall.itl.max, 0.03);
}

TEST(LoadgenSlo, ParsesAllFormsAndMerges) {
  auto s = SloSet::parse({"ttft=0.5,tpot=100ms", "realtime:ttft=300ms,itl=0.2s;batch:e2e=60"});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_TRUE(s->any());
  EXPECT_DOUBLE_EQ(*s->all_classes().ttft_s, 0.5);
  EXPECT_DOUBLE_EQ(*s->all_classes().tpot_s, 0.1);
  Slo rt = s->for_class("realtime");
  EXPECT_DOUBLE_EQ(*rt.ttft_s, 0.3);
  EXPECT_DOUBLE_EQ(*rt.itl_s, 0.2);
  EXPECT_DOUBLE_EQ(*rt.tpot_s, 0.1);  // inherited
  Slo b = s->for_class("batch");
  EXPECT_DOUBLE_EQ(*b.e2e_s, 60.0);
  EXPECT_DOUBLE_EQ(*b.ttft_s, 0.5);
  Slo other = s->for_class("standard");
  EXPECT_FALSE(other.e2e_s.has_value());
  EXPECT_EQ(other.to_string(), "ttft<=0.5s tpot<=0.1s");
}

TEST(LoadgenSlo, ClassPrefixCarriesToLaterItemsOfItsGroupOnly) {
  auto s = SloSet::parse({"realtime:ttft=0.3,tpot=0.05,batch:e2e=9;ttft=1"});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_DOUBLE_EQ(*s->per_class().at("realtime").tpot_s, 0.05);
  EXPECT_FALSE(s->per_class().at("batch").tpot_s.has_value());
  EXPECT_DOUBLE_EQ(*s->all_classes().ttft_s, 1.0);
}

TEST(LoadgenSlo, RejectsBadSpecsWithActionableMessages) {
  for (const char* bad : {"ttft", "ttft=", "ttft=-1", "ttft=abc", "latency=1", "ttft=1,,tpot=2",
                          "bad class:ttft=1", "ttft=1e999"}) {
    auto s = SloSet::parse({bad});
    EXPECT_FALSE(s.ok()) << bad;
    if (!s.ok()) {
      EXPECT_NE(s.status().message().find("--slo"), std::string::npos) << s.status().message();
    }
  }
}

TEST(LoadgenSlo, VacuousLimitsAndFailures) {
  Slo slo;
  slo.tpot_s = 0.01;
  slo.itl_s = 0.05;
  RequestRecord one_token;
  one_token.ttft_s = 0.1;
  one_token.e2e_s = 0.1;
  one_token.completion_tokens = 1;  // no TPOT, no ITL
  EXPECT_TRUE(slo.met_by(one_token));
  RequestRecord slow_gap = one_token;
  slow_gap.itl_s = {0.01, 0.06, 0.01};
  EXPECT_FALSE(slo.met_by(slow_gap));  // itl limits the largest gap
  RequestRecord failed = one_token;
  failed.error = "disconnected";
  EXPECT_FALSE(slo.met_by(failed));
}

}  // namespace
}  // namespace metro::loadgen
