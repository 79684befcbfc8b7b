#include <gtest/gtest.h>

#include "gateway/admission.h"
#include "gateway/batch_window.h"
#include "gateway/quota.h"

namespace metro::gateway {
namespace {

constexpr int64_t kS = 1'000'000'000;

// One request as admission sees it.
struct Ask {
  SlaClass sla_class = SlaClass::kStandard;
  int prompt_tokens = 0;
  int64_t deadline_ns = 0;
  std::string tenant;
};
Decision admit(AdmissionController& a, const Ask& r, int64_t now_ns) {
  return a.admit(r.sla_class, r.prompt_tokens, r.tenant, r.deadline_ns, now_ns);
}
// The SLA policy's order (classes, shortest first, tenants interleaved) unless told otherwise.
AdmissionController make(const AdmissionConfig& cfg,
                         std::shared_ptr<const sched::QueueOrder> order = sched::class_queue_order()) {
  return AdmissionController(cfg, std::move(order));
}

AdmissionConfig base_cfg() {
  AdmissionConfig c;
  c.initial_prefill_tokens_per_s = 1000.0;  // 1 ms per queued prompt token
  c.initial_step_s = 0.05;
  return c;
}

TEST(Admission, QueueBoundOnRequests) {
  AdmissionConfig cfg = base_cfg();
  cfg.limits[0] = {.max_requests = 2, .max_prompt_tokens = 100000};
  AdmissionController a = make(cfg);
  EXPECT_TRUE(admit(a, {SlaClass::kRealtime, 100}, 0).admit);
  EXPECT_TRUE(admit(a, {SlaClass::kRealtime, 100}, 0).admit);
  Decision d = admit(a, {SlaClass::kRealtime, 10}, 0);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.http_status, 503);
  EXPECT_EQ(d.reason, kReasonQueueFull);
  // 200 tokens ahead over 2 requests at 1000 tok/s: a seat frees in ~0.15 s -> 1 s.
  EXPECT_DOUBLE_EQ(d.retry_after_s, 1.0);
  // Other classes have their own queues.
  EXPECT_TRUE(admit(a, {SlaClass::kStandard, 10}, 0).admit);
  a.release(SlaClass::kRealtime, 100, "", 0);
  EXPECT_TRUE(admit(a, {SlaClass::kRealtime, 10}, 0).admit);
}

TEST(Admission, QueueBoundOnPromptTokens) {
  AdmissionConfig cfg = base_cfg();
  cfg.limits[2] = {.max_requests = 100, .max_prompt_tokens = 5000};
  cfg.sla.of(SlaClass::kBatch).ttft_s = 1000.0;
  AdmissionController a = make(cfg);
  EXPECT_TRUE(admit(a, {SlaClass::kBatch, 4000}, 0).admit);
  Decision d = admit(a, {SlaClass::kBatch, 3500}, 0);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.reason, kReasonQueueTokens);
  EXPECT_EQ(d.http_status, 503);
  EXPECT_DOUBLE_EQ(d.retry_after_s, 3.0);  // 2500 tokens too many at 1000 tok/s = 2.5 s -> 3
  EXPECT_TRUE(admit(a, {SlaClass::kBatch, 1000}, 0).admit);
}

// What no wait would let in is a 400 naming the bound, never a 503 with a Retry-After: a
// prompt larger than its class queue's token bound, or one whose own prefill on an idle
// server already misses the class's time-to-first-token bound.
TEST(Admission, WhatCanNeverBeAdmittedIs400) {
  AdmissionConfig cfg = base_cfg();
  cfg.limits[2] = {.max_requests = 100, .max_prompt_tokens = 5000};
  AdmissionController a = make(cfg);
  Decision big = admit(a, {SlaClass::kBatch, 6000}, 0);
  EXPECT_FALSE(big.admit);
  EXPECT_EQ(big.http_status, 400);
  EXPECT_EQ(big.reason, kReasonOverQueueBound);
  EXPECT_NE(big.message.find("5000"), std::string::npos) << big.message;
  // Standard: 2 s objective x margin 1. 4000 tokens at 1000 tok/s take 4 s even idle.
  Decision slow = admit(a, {SlaClass::kStandard, 4000}, 0);
  EXPECT_FALSE(slow.admit);
  EXPECT_EQ(slow.http_status, 400);
  EXPECT_EQ(slow.reason, kReasonTooLongForClass);
  EXPECT_NE(slow.message.find("standard"), std::string::npos) << slow.message;
  EXPECT_TRUE(admit(a, {SlaClass::kBatch, 4000}, 0).admit) << "the batch class takes it";
  // A prompt that fits an idle server but not the queue now is load: 503.
  Decision later = admit(a, {SlaClass::kBatch, 4000}, 0);
  EXPECT_EQ(later.http_status, 503);
  EXPECT_EQ(a.state().requests[2], 1);  // refusals queue nothing
}

TEST(Admission, PredictedTtftOverTheObjectiveIsRefusedEarly) {
  AdmissionConfig cfg = base_cfg();
  // FIFO inside the class keeps the arithmetic plain.
  AdmissionController a = make(cfg, sched::class_queue_order(/*shortest_first=*/false));
  // Standard TTFT objective 2 s. 1500 tokens queued + 400 own = 1.9 s + 0.05 step: fits.
  EXPECT_TRUE(admit(a, {SlaClass::kStandard, 1500}, 0).admit);
  EXPECT_NEAR(a.predicted_ttft_s(SlaClass::kStandard, 400), 1.95, 1e-9);
  EXPECT_TRUE(admit(a, {SlaClass::kStandard, 400}, 0).admit);
  // Now 1900 ahead + 1000 own = 2.95 s > 2 s: refused with Retry-After ~ 0.95 s -> 1.
  Decision d = admit(a, {SlaClass::kStandard, 1000}, 0);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.reason, kReasonTtft);
  EXPECT_EQ(d.http_status, 503);
  EXPECT_DOUBLE_EQ(d.retry_after_s, 1.0);
  // Retry-After grows with the queue.
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(admit(a, {SlaClass::kBatch, 1000}, 0).admit);  // batch: 30 s
  Decision far = admit(a, {SlaClass::kBatch, 25000}, 0);
  EXPECT_FALSE(far.admit);
  // 1900 + 5000 + 25000 tokens = 31.9 s + 0.05 - 30 s = 1.95 s -> 2.
  EXPECT_DOUBLE_EQ(far.retry_after_s, 2.0);
}

// At high load the engine's adaptive controller caps the margin: what is predicted to miss
// its objective at all is refused, not only what would miss it by ttft_margin times; the
// prompt's own shape is still judged by the configured margin, and the cap lifts with the
// load.
TEST(Admission, TheControllersMarginCapRefusesEarlierAtHighLoad) {
  AdmissionConfig cfg = base_cfg();
  cfg.ttft_margin = 3.0;  // standard: refused past 6 s
  AdmissionController a = make(cfg, sched::class_queue_order(/*shortest_first=*/false));
  ASSERT_TRUE(admit(a, {SlaClass::kStandard, 3000}, 0).admit);  // 3.05 s predicted
  EXPECT_DOUBLE_EQ(a.effective_ttft_margin(), 3.0);
  gateway::StepObservation idle;  // a step that moves no rate
  idle.step_s = 0.05;
  gateway::StepObservation peak = idle;
  peak.ttft_margin_cap = 1.0;
  a.observe_step(peak);
  EXPECT_DOUBLE_EQ(a.effective_ttft_margin(), 1.0);
  Decision d = admit(a, {SlaClass::kStandard, 500}, 0);  // 3.55 s: late, not 3x late
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.http_status, 503);
  EXPECT_EQ(d.reason, kReasonTtft);
  // 5000 tokens take 5.05 s on an idle server: within 3 x 2 s, so load (503), not shape (400).
  d = admit(a, {SlaClass::kStandard, 5000}, 0);
  EXPECT_EQ(d.http_status, 503);
  // Realtime is judged by the same cap against its own objective (0.5 s): 100 tokens fit.
  EXPECT_TRUE(admit(a, {SlaClass::kRealtime, 100}, 0).admit);
  a.observe_step(idle);  // the load eased: the configured margin again
  EXPECT_DOUBLE_EQ(a.effective_ttft_margin(), 3.0);
  EXPECT_TRUE(admit(a, {SlaClass::kStandard, 500}, 0).admit);
  // A cap above the configured margin changes nothing.
  peak.ttft_margin_cap = 5.0;
  a.observe_step(peak);
  EXPECT_DOUBLE_EQ(a.effective_ttft_margin(), 3.0);
}

TEST(Admission, HigherClassesDoNotWaitBehindLowerOnes) {
  AdmissionController a = make(base_cfg());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(admit(a, {SlaClass::kBatch, 2000}, 0).admit);
  // 20 s of batch prompt queued, but realtime is served first: only its own 100 tokens.
  EXPECT_NEAR(a.predicted_ttft_s(SlaClass::kRealtime, 100), 0.15, 1e-9);
  EXPECT_TRUE(admit(a, {SlaClass::kRealtime, 100}, 0).admit);
  // Under FCFS everything queued is ahead.
  AdmissionConfig fcfs = base_cfg();
  AdmissionController b = make(fcfs, sched::fifo_queue_order());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(admit(b, {SlaClass::kBatch, 2000}, 0).admit);
  Decision d = admit(b, {SlaClass::kRealtime, 100}, 0);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.reason, kReasonTtft);
}

TEST(Admission, MeasuredRatesMoveThePrediction) {
  AdmissionController a = make(base_cfg());
  ASSERT_TRUE(admit(a, {SlaClass::kStandard, 1000}, 0).admit);
  ASSERT_TRUE(admit(a, {SlaClass::kRealtime, 100}, 0).admit);
  // Realtime ahead at the prefill rate, then its class's queue and its own 1000 at the
  // class's drain rate, then a step.
  EXPECT_NEAR(a.predicted_ttft_s(SlaClass::kStandard, 1000), 0.1 + 2.0 + 0.05, 1e-9);
  // Prompts run at 4000 tok/s of prefill work, but standard, backlogged, only got 100
  // tokens per 0.2 s step (realtime and decodes took the rest): it drains at 500 tok/s.
  gateway::StepObservation o;
  o.step_s = 0.2;
  o.prefill_tokens = {300, 100, 0};
  o.prefill_s = 0.1;
  o.backlogged = {false, true, false};
  for (int i = 0; i < 60; ++i) a.observe_step(o);
  QueueState q = a.state();
  EXPECT_NEAR(q.prefill_tokens_per_s, 4000.0, 1.0);
  EXPECT_NEAR(q.drain_tokens_per_s[1], 500.0, 1.0);
  EXPECT_NEAR(q.drain_tokens_per_s[0], 4000.0, 1.0) << "not backlogged, nothing above it: the whole prefill rate";
  EXPECT_NEAR(q.drain_tokens_per_s[2], 1000.0, 1e-9) << "below a backlogged class: no observation";
  EXPECT_NEAR(q.fifo_drain_tokens_per_s, 2000.0, 1.0);
  EXPECT_NEAR(q.step_s, 0.2, 1e-3);
  EXPECT_NEAR(a.predicted_ttft_s(SlaClass::kStandard, 1000), 100.0 / 4000.0 + 2000.0 / 500.0 + 0.2, 1e-2);
  // A starved class drains at 0: its requests are refused.
  o.prefill_tokens = {400, 0, 0};
  for (int i = 0; i < 200; ++i) a.observe_step(o);
  Decision d = admit(a, {SlaClass::kStandard, 10}, 0);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.reason, kReasonTtft);
}

TEST(Admission, ShortestFirstCountsOnlyShorterPromptsOfTheClass) {
  AdmissionController a = make(base_cfg());
  ASSERT_TRUE(admit(a, {SlaClass::kStandard, 1500}, 0).admit);
  ASSERT_TRUE(admit(a, {SlaClass::kStandard, 100}, 0).admit);
  // A 200-token prompt waits behind the 100-token one only: 0.3 s + step.
  EXPECT_NEAR(a.predicted_ttft_s(SlaClass::kStandard, 200), 0.35, 1e-9);
  // A 1600-token one behind both.
  EXPECT_NEAR(a.predicted_ttft_s(SlaClass::kStandard, 1600), 3.25, 1e-9);
  a.release(SlaClass::kStandard, 100, "", 0);
  EXPECT_NEAR(a.predicted_ttft_s(SlaClass::kStandard, 200), 0.25, 1e-9);
  AdmissionConfig fifo = base_cfg();
  AdmissionController b = make(fifo, sched::class_queue_order(/*shortest_first=*/false));
  ASSERT_TRUE(admit(b, {SlaClass::kStandard, 1500}, 0).admit);
  EXPECT_NEAR(b.predicted_ttft_s(SlaClass::kStandard, 200), 1.75, 1e-9);
}

Ask of(const std::string& tenant, int prompt, SlaClass c = SlaClass::kStandard) {
  Ask r;
  r.sla_class = c;
  r.prompt_tokens = prompt;
  r.tenant = tenant;
  return r;
}

// A flood from one tenant fills its class's queue and makes its own requests late; a quiet
// tenant of the same class is judged by what fair share puts ahead of it, not the flood.
TEST(Admission, AFloodingTenantDoesNotGetAQuietOneRefused) {
  AdmissionConfig cfg = base_cfg();  // 1000 tok/s, 50 ms step
  cfg.sla.of(SlaClass::kStandard).ttft_s = 10.0;
  cfg.limits[1] = {.max_requests = 10, .max_prompt_tokens = 100000};
  AdmissionController a = make(cfg);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(admit(a, of("loud", 300), 0).admit);
  // 3000 tokens queued: a loud request would wait ~3.3 s; the class is full.
  Decision loud = admit(a, of("loud", 300), 0);
  EXPECT_FALSE(loud.admit);
  EXPECT_EQ(loud.reason, kReasonQueueFull);
  // The quiet tenant holds none of the 10 seats (its share: 5): admitted past the bound,
  // its wait predicted as its own 300 + at most 300 of the flood's, interleaved.
  EXPECT_NEAR(a.predicted_ttft_s(SlaClass::kStandard, 300, "quiet"), 0.6 + 0.05, 1e-9);
  EXPECT_NEAR(a.predicted_ttft_s(SlaClass::kStandard, 300, "loud"), 3.3 + 0.05, 1e-9);
  EXPECT_TRUE(admit(a, of("quiet", 300), 0).admit);
  EXPECT_EQ(a.state().requests[1], 11);
  // Its share of the bound (10 / 2 tenants = 5) still binds: not a second flood.
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(admit(a, of("quiet", 10), 0).admit) << i;
  EXPECT_EQ(admit(a, of("quiet", 10), 0).reason, kReasonQueueFull);
  // Without fair share (FCFS, or the option off) the class queue is one queue.
  AdmissionController fifo = make(cfg, sched::class_queue_order(true, /*tenant_fair_share=*/false));
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(admit(fifo, of("loud", 300), 0).admit);
  EXPECT_EQ(admit(fifo, of("quiet", 300), 0).reason, kReasonQueueFull);
  EXPECT_NEAR(fifo.predicted_ttft_s(SlaClass::kStandard, 300, "quiet"), 3.3 + 0.05, 1e-9);
  // Releases are per tenant: the quiet tenant's 300 leaves; its four 10-token prompts stay
  // ahead of a loud request (3000 of its own + 40 + 300).
  a.release(SlaClass::kStandard, 300, "quiet", 0);
  EXPECT_NEAR(a.predicted_ttft_s(SlaClass::kStandard, 300, "loud"), 3.34 + 0.05, 1e-9);
}

TEST(Admission, Deadlines) {
  AdmissionController a = make(base_cfg());
  // 500 tokens: 0.55 s predicted; a deadline 0.3 s away cannot be met.
  Decision d = admit(a, {SlaClass::kBatch, 500, 10 * kS + kS * 3 / 10}, 10 * kS);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.reason, kReasonDeadline);
  EXPECT_TRUE(admit(a, {SlaClass::kBatch, 500, 11 * kS}, 10 * kS).admit);
  // Releasing more than was queued cannot drive the queue negative.
  a.release(SlaClass::kBatch, 500, "", 10 * kS);
  a.release(SlaClass::kBatch, 500, "", 10 * kS);
  EXPECT_EQ(a.state().requests[2], 0);
  EXPECT_EQ(a.state().prompt_tokens[2], 0);
}

// What the prediction cannot see shows in the wait: a class whose oldest admitted request
// has waited past the bound without a first token takes no more until that request leaves;
// every admitted request carries a deadline of shed_after x the bound into the engine.
TEST(Admission, AClassBehindItsBoundTakesNoMoreAndAdmittedRequestsCarryADeadline) {
  AdmissionConfig cfg = base_cfg();  // 1000 tok/s, 50 ms step
  cfg.sla.of(SlaClass::kBatch).ttft_s = 10.0;
  cfg.ttft_margin = 1.0;
  cfg.shed_after = 1.5;
  AdmissionController a = make(cfg);
  ASSERT_TRUE(admit(a, {SlaClass::kBatch, 100}, 0).admit);
  ASSERT_TRUE(admit(a, {SlaClass::kBatch, 100}, 5 * kS).admit);
  EXPECT_NEAR(a.state(9 * kS).oldest_wait_s[2], 9.0, 1e-9);
  // 11 s later the first still has no first token: past the 10 s bound, though the queue
  // (200 tokens, 0.25 s) predicts a fast start.
  EXPECT_LT(a.predicted_ttft_s(SlaClass::kBatch, 100), 1.0);
  Decision d = admit(a, {SlaClass::kBatch, 100}, 11 * kS);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.http_status, 503);
  EXPECT_EQ(d.reason, kReasonTtft);
  EXPECT_DOUBLE_EQ(d.retry_after_s, 4.0);  // until it is shed: 15 s after its admission
  EXPECT_NE(d.message.find("behind"), std::string::npos) << d.message;
  // Other classes are judged by their own waits.
  EXPECT_TRUE(admit(a, {SlaClass::kStandard, 100}, 11 * kS).admit);
  // The old one leaves (first token, or shed): the next oldest has waited 6 s: admitted.
  a.release(SlaClass::kBatch, 100, "", 0);
  EXPECT_TRUE(admit(a, {SlaClass::kBatch, 100}, 11 * kS).admit);
  EXPECT_NEAR(a.state(11 * kS).oldest_wait_s[2], 6.0, 1e-9);
  // The deadline into the engine: 1.5 x the bound after admission, or the client's if sooner.
  EXPECT_EQ(a.shed_deadline_ns(SlaClass::kBatch, 2 * kS, 0), 17 * kS);
  EXPECT_EQ(a.shed_deadline_ns(SlaClass::kBatch, 2 * kS, 4 * kS), 4 * kS);
  EXPECT_EQ(a.shed_deadline_ns(SlaClass::kBatch, 2 * kS, 30 * kS), 17 * kS);
  cfg.shed_after = 0.0;
  AdmissionController never = make(cfg);
  EXPECT_EQ(never.shed_deadline_ns(SlaClass::kBatch, 2 * kS, 0), 0);
  EXPECT_EQ(never.shed_deadline_ns(SlaClass::kBatch, 2 * kS, 4 * kS), 4 * kS);
  cfg.shed_after = 0.5;
  EXPECT_FALSE(validate(cfg).ok());
}

// A step in which `begun` batch requests had begun output and got `tokens` output tokens.
StepObservation batch_output_step(double step_s, int begun, int tokens) {
  StepObservation o;
  o.step_s = step_s;
  o.begun[2] = begun;
  o.output_tokens[2] = tokens;
  return o;
}

TEST(Admission, AClassWhoseOutputIsBehindPaceTakesNoMore) {
  AdmissionConfig cfg = base_cfg();
  cfg.sla.of(SlaClass::kBatch).tpot_s = 1.0;
  cfg.ttft_margin = 2.0;  // pace bound: 2 s per output token
  AdmissionController a = make(cfg);
  // Eight batch requests decode, each a token per 0.1 s step: on pace.
  for (int i = 0; i < 20; ++i) a.observe_step(batch_output_step(0.1, 8, 8));
  EXPECT_NEAR(a.state().pace_s[2], 0.1, 1e-9);
  EXPECT_EQ(a.state().begun[2], 8);
  EXPECT_TRUE(admit(a, {SlaClass::kBatch, 10}, 0).admit);
  a.release(SlaClass::kBatch, 10, "", 0);
  // Higher classes take the steps: one batch token per 0.25 s step for the eight, 2 s per
  // token each, then less.
  for (int i = 0; i < 60; ++i) a.observe_step(batch_output_step(0.25, 8, i % 2));
  EXPECT_GT(a.state().pace_s[2], 2.0);
  Decision d = admit(a, {SlaClass::kBatch, 10}, 0);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.http_status, 503);
  EXPECT_EQ(d.reason, kReasonTpot);
  EXPECT_GE(d.retry_after_s, 1.0);
  EXPECT_NE(d.message.find("time-per-output-token"), std::string::npos) << d.message;
  // Classes on pace are not refused for it.
  EXPECT_TRUE(admit(a, {SlaClass::kStandard, 10}, 0).admit);
  // Back on pace: admitted again.
  for (int i = 0; i < 40; ++i) a.observe_step(batch_output_step(0.1, 8, 8));
  EXPECT_LT(a.state().pace_s[2], 2.0);
  EXPECT_TRUE(admit(a, {SlaClass::kBatch, 10}, 0).admit);
  a.release(SlaClass::kBatch, 10, "", 0);
  // Behind again; then every begun request ends: nothing runs slowly, the class is open and
  // its pace starts afresh with the next begun requests.
  for (int i = 0; i < 60; ++i) a.observe_step(batch_output_step(0.25, 8, 0));
  EXPECT_FALSE(admit(a, {SlaClass::kBatch, 10}, 0).admit);
  a.observe_step(batch_output_step(0.25, 0, 0));
  EXPECT_EQ(a.state().pace_s[2], 0.0);
  EXPECT_TRUE(admit(a, {SlaClass::kBatch, 10}, 0).admit);
  a.observe_step(batch_output_step(0.1, 2, 2));
  EXPECT_NEAR(a.state().pace_s[2], 0.1, 1e-9);
}

TEST(Admission, ConfigValidation) {
  AdmissionConfig c;
  EXPECT_TRUE(validate(c).ok());
  c.ttft_margin = 0.0;
  EXPECT_FALSE(validate(c).ok());
  c = AdmissionConfig{};
  c.initial_prefill_tokens_per_s = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(validate(c).ok());
  c = AdmissionConfig{};
  c.limits[1].max_requests = -1;
  Status st = validate(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("standard"), std::string::npos);
}

TEST(Quota, TokenBucketRefusesWith429AndExactRetryAfter) {
  QuotaManager q;
  q.set_quota("acme", {.tokens_per_minute = 600.0});  // 10 tokens/s, bucket 600
  EXPECT_TRUE(q.admit("acme", 500, 0).admit);
  Decision d = q.admit("acme", 250, 0);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.http_status, 429);
  EXPECT_EQ(d.reason, kReasonTenantRate);
  EXPECT_DOUBLE_EQ(d.retry_after_s, 15.0);  // 150 tokens short at 10/s
  // After 15 s the bucket has refilled enough.
  EXPECT_TRUE(q.admit("acme", 250, 15 * kS).admit);
  // Other tenants are not affected (default quota: unlimited).
  EXPECT_TRUE(q.admit("other", 1'000'000, 0).admit);
}

TEST(Quota, UnusedTokensAreRefunded) {
  QuotaManager q;
  q.set_quota("t", {.tokens_per_minute = 60.0, .burst_tokens = 100.0});
  ASSERT_TRUE(q.admit("t", 100, 0).admit);  // charged prompt + max_tokens
  EXPECT_FALSE(q.admit("t", 50, 0).admit);
  q.release("t", 100, 40, 1.0, 0);  // it used 40
  EXPECT_NEAR(q.state("t", 0).bucket_tokens, 60.0, 1e-9);
  EXPECT_TRUE(q.admit("t", 50, 0).admit);
}

// A request dearer than the whole bucket could never be charged: 400, not a wait. Each
// request is charged in full (prompt + max_tokens), so the quota cannot be outrun by large
// max_tokens, and settles to what it used.
TEST(Quota, ChargesInFullAndRefusesWhatNoBucketHolds) {
  QuotaManager q;
  q.set_quota("t", {.tokens_per_minute = 60.0});  // bucket 60
  Decision d = q.admit("t", 1000, 0);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.http_status, 400);
  EXPECT_EQ(d.reason, kReasonOverQuotaBucket);
  EXPECT_NE(d.message.find("1000"), std::string::npos) << d.message;
  EXPECT_NE(d.message.find("60"), std::string::npos) << d.message;
  EXPECT_FALSE(q.admit("t", 1000, 3600 * kS).admit) << "no wait makes it fit";
  // A 60-token request empties the bucket: one of 10 is then refused until it refills.
  ASSERT_TRUE(q.admit("t", 60, 3600 * kS).admit);
  EXPECT_EQ(q.admit("t", 10, 3600 * kS).reason, kReasonTenantRate);
  // It used 70 (more than charged, e.g. a count the charge missed): the excess is debited,
  // and the bucket refills from below zero.
  q.release("t", 60, 70, 1.0, 3600 * kS);
  EXPECT_NEAR(q.state("t", 3600 * kS).bucket_tokens, -10.0, 1e-9);
  EXPECT_FALSE(q.admit("t", 5, 3600 * kS + 10 * kS).admit);  // 0 tokens after 10 s
  EXPECT_TRUE(q.admit("t", 5, 3600 * kS + 15 * kS).admit);
  // Over a minute a tenant gets its tokens per minute, whatever max_tokens it asks for.
  QuotaManager r;
  r.set_quota("u", {.tokens_per_minute = 600.0});
  int64_t granted = 0;
  for (int s = 0; s <= 60; ++s) {
    while (r.admit("u", 100, s * kS).admit) {
      granted += 100;
      r.release("u", 100, 100, 0.1, s * kS);
    }
  }
  EXPECT_LE(granted, 600 + 600);  // a full bucket at the start plus a minute's refill
}

TEST(Quota, ConcurrencyLimit) {
  QuotaManager q;
  q.set_quota("t", {.max_concurrent = 2});
  ASSERT_TRUE(q.admit("t", 10, 0).admit);
  ASSERT_TRUE(q.admit("t", 10, 0).admit);
  Decision d = q.admit("t", 10, 0);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.http_status, 429);
  EXPECT_EQ(d.reason, kReasonTenantConcurrency);
  EXPECT_DOUBLE_EQ(d.retry_after_s, 1.0);
  q.release("t", 10, 10, 8.0, 0);  // it took 8 s
  ASSERT_TRUE(q.admit("t", 10, 0).admit);
  Decision d2 = q.admit("t", 10, 0);
  EXPECT_DOUBLE_EQ(d2.retry_after_s, 4.0);  // mean 8 s over 2 in flight
  EXPECT_FALSE(validate(TenantQuota{.tokens_per_minute = -1.0}).ok());
}

TEST(BatchWindow, WaitDerivesFromTheClassObjective) {
  SlaConfig sla;
  BatchWindow w({}, sla);
  EXPECT_DOUBLE_EQ(w.max_wait_s(SlaClass::kRealtime), 0.025);
  EXPECT_DOUBLE_EQ(w.max_wait_s(SlaClass::kStandard), 0.1);
  EXPECT_DOUBLE_EQ(w.max_wait_s(SlaClass::kBatch), 0.5);  // capped
}

TEST(BatchWindow, FlushesOnSizeOrOnTheOldestWait) {
  SlaConfig sla;
  BatchWindowConfig cfg;
  cfg.max_batch = {4, 4, 8};
  BatchWindow w(cfg, sla);
  const int64_t ms = 1'000'000;
  w.push(1, SlaClass::kStandard, 10, 0);
  w.push(2, SlaClass::kStandard, 10, 10 * ms);
  EXPECT_TRUE(w.take_ready(50 * ms).empty());
  ASSERT_TRUE(w.next_deadline_ns().has_value());
  EXPECT_EQ(*w.next_deadline_ns(), 100 * ms);  // the oldest standard item's wait is 100 ms
  EXPECT_EQ(w.take_ready(100 * ms), (std::vector<uint64_t>{1, 2}));
  EXPECT_FALSE(w.next_deadline_ns().has_value());
  // Size trigger: the fourth realtime item makes a full batch at once.
  for (uint64_t i = 10; i < 14; ++i) w.push(i, SlaClass::kRealtime, 5, 200 * ms);
  EXPECT_EQ(w.take_ready(200 * ms), (std::vector<uint64_t>{10, 11, 12, 13}));
}

TEST(BatchWindow, HigherClassesFirstLowerOnesRideAlongAndTokenCap) {
  SlaConfig sla;
  BatchWindowConfig cfg;
  cfg.max_batch = {3, 8, 8};
  cfg.max_batch_tokens = 100;
  BatchWindow w(cfg, sla);
  const int64_t ms = 1'000'000;
  w.push(1, SlaClass::kBatch, 10, 0);
  w.push(2, SlaClass::kRealtime, 10, 1 * ms);
  w.push(3, SlaClass::kStandard, 10, 2 * ms);
  w.push(4, SlaClass::kBatch, 10, 3 * ms);
  // Realtime's 25 ms wait expires first: realtime, then standard, then batch ride along up
  // to realtime's batch size of 3.
  EXPECT_EQ(w.take_ready(26 * ms), (std::vector<uint64_t>{2, 3, 1}));
  EXPECT_EQ(w.size(), 1u);
  EXPECT_TRUE(w.cancel(4));
  EXPECT_FALSE(w.cancel(4));
  // Token cap: 60 + 60 > 100 -> one at a time; the trigger is the token total.
  w.push(5, SlaClass::kBatch, 60, 30 * ms);
  w.push(6, SlaClass::kBatch, 60, 30 * ms);
  EXPECT_EQ(w.take_ready(30 * ms), (std::vector<uint64_t>{5}));
  // A single item over the cap still runs (alone) once due.
  w.push(7, SlaClass::kBatch, 500, 30 * ms);
  EXPECT_EQ(w.take_ready(30 * ms), (std::vector<uint64_t>{6}));
  EXPECT_EQ(w.take_ready(30 * ms), (std::vector<uint64_t>{7}));
  EXPECT_EQ(w.size(), 0u);
}

}  // namespace
}  // namespace metro::gateway
