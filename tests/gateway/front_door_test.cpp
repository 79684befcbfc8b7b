#include "gateway/traffic_policy.h"

#include <gtest/gtest.h>

namespace metro::gateway {
namespace {

using sched::SlaClass;
constexpr int64_t kS = 1'000'000'000;

TrafficPolicyConfig base_cfg() {
  TrafficPolicyConfig c;
  c.admission_cfg.initial_prefill_tokens_per_s = 1000.0;
  c.admission_cfg.initial_step_s = 0.01;
  return c;
}

TrafficRequest req(const std::string& tenant, SlaClass c, int prompt, int64_t max_new) {
  TrafficRequest r;
  r.tenant = tenant;
  r.sla_class = c;
  r.prompt_tokens = prompt;
  r.max_new_tokens = max_new;
  return r;
}

TEST(TrafficPolicy, QuotaRefusesBeforeAdmissionAndIsCountedPerClass) {
  TrafficPolicyConfig cfg = base_cfg();
  cfg.tenant_quotas = {{"small", TenantQuota{.tokens_per_minute = 60, .burst_tokens = 100, .max_concurrent = 0}}};
  ASSERT_TRUE(validate(cfg).ok());
  TrafficPolicy p(cfg);
  sched::SchedMetrics m(cfg.admission_cfg.sla);
  p.attach_metrics(&m);
  const TrafficRequest r = req("small", SlaClass::kStandard, 20, 60);  // costs 80 of 100
  ASSERT_TRUE(p.admit(r, 0).admit);
  Decision d = p.admit(r, 0);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.http_status, 429);
  EXPECT_EQ(d.reason, kReasonTenantRate);
  // 80 needed, 20 left, 1 token/s: 60 s.
  EXPECT_NEAR(d.retry_after_s, 60.0, 1.0);
  // The refused request took no queue seat: only the first one is queued.
  EXPECT_EQ(p.queue_state().requests[1], 1);
  // It used 30 of its 80: 50 come back, and a request of 70 fits again.
  p.first_token(r);
  p.done(r, 30, 1.0, 0);
  EXPECT_EQ(p.queue_state().requests[1], 0);
  EXPECT_TRUE(p.admit(req("small", SlaClass::kStandard, 10, 60), 0).admit);
  // Other tenants are unlimited by default.
  EXPECT_TRUE(p.admit(req("big", SlaClass::kStandard, 10, 100000), 0).admit);
  EXPECT_EQ(m.snapshot().classes[1].rejections.at(kReasonTenantRate), 1u);
}

TEST(TrafficPolicy, AdmissionRefusalRefundsTheQuotaCharge) {
  TrafficPolicyConfig cfg = base_cfg();
  cfg.tenant_quotas = {{"t", TenantQuota{.tokens_per_minute = 600, .burst_tokens = 1000, .max_concurrent = 2}}};
  TrafficPolicy p(cfg);
  // Realtime objective 0.5 s at 1000 tok/s: a 900-token prompt is predicted at ~0.9 s.
  Decision d = p.admit(req("t", SlaClass::kRealtime, 900, 10), 0);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.http_status, 503);
  EXPECT_EQ(d.reason, kReasonTtft);
  // Neither its tokens nor its concurrency slot stay charged: two requests of 450 fit.
  EXPECT_TRUE(p.admit(req("t", SlaClass::kBatch, 440, 10), 0).admit);
  EXPECT_TRUE(p.admit(req("t", SlaClass::kBatch, 440, 10), 0).admit);
  Decision third = p.admit(req("t", SlaClass::kBatch, 1, 1), 0);
  EXPECT_EQ(third.reason, kReasonTenantConcurrency);
}

TEST(TrafficPolicy, PrefixCacheHitsAreNotQueuedWorkButAreCharged) {
  TrafficPolicyConfig cfg = base_cfg();
  cfg.tenant_quotas = {{"t", TenantQuota{.tokens_per_minute = 600, .burst_tokens = 1000, .max_concurrent = 0}}};
  TrafficPolicy p(cfg);
  // Realtime objective 0.5 s at 1000 tok/s: 900 prompt tokens to compute miss it...
  TrafficRequest r = req("t", SlaClass::kRealtime, 900, 10);
  EXPECT_FALSE(p.admit(r, 0).admit);
  // ... 50 of them (the rest in the prefix cache) do not.
  r.cached_prompt_tokens = 850;
  ASSERT_TRUE(p.admit(r, 0).admit);
  EXPECT_EQ(p.queue_state().prompt_tokens[0], 50);
  // The quota charged the whole prompt: 910 of 1000, so the same request again is over it.
  Decision again = p.admit(r, 0);
  EXPECT_FALSE(again.admit);
  EXPECT_EQ(again.reason, kReasonTenantRate);
  p.first_token(r);
  EXPECT_EQ(p.queue_state().prompt_tokens[0], 0);
  EXPECT_EQ(p.queue_state().requests[0], 0);
  // A prompt held whole by the cache still computes its last token.
  TrafficRequest all = req("other", SlaClass::kStandard, 64, 1);
  all.cached_prompt_tokens = 64;
  ASSERT_TRUE(p.admit(all, 0).admit);
  EXPECT_EQ(p.queue_state().prompt_tokens[1], 1);
}

TEST(TrafficPolicy, AdmissionIsFairBetweenTenantsOfAClass) {
  TrafficPolicyConfig cfg = base_cfg();
  cfg.admission_cfg.limits[1] = {.max_requests = 4, .max_prompt_tokens = 1 << 20};
  cfg.admission_cfg.sla.of(SlaClass::kStandard).ttft_s = 100.0;
  TrafficPolicy p(cfg);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(p.admit(req("loud", SlaClass::kStandard, 100, 10), 0).admit);
  EXPECT_EQ(p.admit(req("loud", SlaClass::kStandard, 100, 10), 0).reason, kReasonQueueFull);
  const TrafficRequest quiet = req("quiet", SlaClass::kStandard, 100, 10);
  EXPECT_TRUE(p.admit(quiet, 0).admit) << "below its share of the full class";
  p.first_token(quiet);  // releases the quiet tenant's entry, not one of the flood's
  EXPECT_EQ(p.queue_state().requests[1], 4);
  EXPECT_EQ(p.admit(req("loud", SlaClass::kStandard, 100, 10), 0).reason, kReasonQueueFull);
  // FCFS (no tenant fair share): one queue for everybody.
  cfg.admission_cfg.tenant_fair_share = false;
  TrafficPolicy fifo(cfg);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(fifo.admit(req("loud", SlaClass::kStandard, 100, 10), 0).admit);
  EXPECT_EQ(fifo.admit(quiet, 0).reason, kReasonQueueFull);
}

TEST(TrafficPolicy, StepReportsMoveThePrediction) {
  TrafficPolicy p(base_cfg());
  const double before = p.queue_state().prefill_tokens_per_s;
  engine::StepReport rep;
  rep.step_s = 0.1;
  rep.prefill_tokens = 500;  // 500 prompt tokens in 0.1 s: 5000 tok/s
  rep.prefill_tokens_by_class = {0, 500, 0};
  rep.waiting_by_class = {0, 3, 0};
  for (int i = 0; i < 50; ++i) p.observe_step(rep);
  const QueueState q = p.queue_state();
  EXPECT_GT(q.prefill_tokens_per_s, before);
  EXPECT_NEAR(q.prefill_tokens_per_s, 5000.0, 50.0);
  EXPECT_NEAR(q.drain_tokens_per_s[1], 5000.0, 50.0);
  EXPECT_NEAR(q.step_s, 0.1, 0.01);
  // A 900-token realtime prompt now fits its 0.5 s objective.
  EXPECT_TRUE(p.admit(req("", SlaClass::kRealtime, 900, 10), 0).admit);
}

TEST(TrafficPolicy, DeadlinesAndAdmissionOff) {
  TrafficPolicy on(base_cfg());
  TrafficRequest r = req("", SlaClass::kBatch, 100, 10);
  r.deadline_ns = 10 * kS + kS / 100;  // 10 ms after now; 100 tokens take ~100 ms
  Decision d = on.admit(r, 10 * kS);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.reason, kReasonDeadline);
  TrafficPolicyConfig cfg = base_cfg();
  cfg.admission = false;
  TrafficPolicy off(cfg);
  EXPECT_TRUE(off.admit(r, 10 * kS).admit);
  // Off, even a huge queue is admitted (a conventional server's behaviour).
  for (int i = 0; i < 5000; ++i) EXPECT_TRUE(off.admit(req("", SlaClass::kRealtime, 4000, 10), 0).admit);
}

TEST(TrafficPolicy, ValidateNamesTheTenant) {
  TrafficPolicyConfig cfg = base_cfg();
  cfg.tenant_quotas = {{"bad-tenant", TenantQuota{.tokens_per_minute = -5}}};
  Status s = validate(cfg);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("bad-tenant"), std::string::npos);
}

}  // namespace
}  // namespace metro::gateway
