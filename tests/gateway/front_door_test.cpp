// The gateway's front door over real engines (the default model): quotas before admission,
// refunds, prefix-cache credit, fairness from the engine's own queue order, the choice bound,
// and many models in one registry sharing one compute pool.
#include "gateway/front_door.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "base/clock.h"
#include "engine/engine_test_util.h"
#include "support/test_util.h"

namespace metro::gateway {
namespace {

using testing::collect;
using testing::default_model;
using testing::greedy_request;
using testing::sanitized;

FrontDoorConfig base_cfg() {
  FrontDoorConfig c;
  c.calibrate = false;  // the tests set the starting rates
  c.admission_cfg.initial_prefill_tokens_per_s = 1000.0;
  c.admission_cfg.initial_step_s = 0.01;
  return c;
}

std::shared_ptr<ServedModel> served(const std::string& name, engine::EngineConfig ec = {}) {
  const auto& sm = default_model();
  if (ec.n_threads == 0 && !ec.pool) ec.n_threads = 1;
  if (ec.ctx_total == 0) ec.ctx_total = 4096;
  if (ec.n_ctx == 0) ec.n_ctx = 1024;
  auto e = engine::Engine::create(sm.model, *sm.tokenizer, ec);
  EXPECT_TRUE(e.ok()) << e.status().message();
  auto m = std::make_shared<ServedModel>();
  m->name = name;
  m->engine = std::shared_ptr<engine::Engine>(std::move(*e));
  return m;
}

std::vector<int32_t> tokens(int n, int32_t start = 500) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(start + i % 300);
  return t;
}

CallRequest req(const std::shared_ptr<const ServedModel>& m, const std::string& tenant, SlaClass c, int prompt,
                int max_tokens, int32_t start = 500) {
  CallRequest r;
  r.model = m;
  r.tenant = tenant;
  r.sla_class = c;
  r.requests.push_back(greedy_request(tokens(prompt, start), max_tokens));
  r.requests.back().sla_class = c;
  r.requests.back().tenant = tenant;  // as the server sets it: the prefix cache is per tenant
  r.prompt_tokens = prompt;
  r.max_tokens = max_tokens;
  return r;
}

// Waits for a step report after which the engine holds no sequence.
class IdleWatch : public engine::StepObserver {
 public:
  void on_step(const engine::StepReport& rep) override {
    int n = 0;
    for (size_t c = 0; c < rep.running_by_class.size(); ++c) n += rep.running_by_class[c] + rep.waiting_by_class[c];
    std::lock_guard<std::mutex> lock(mu_);
    idle_ = n == 0;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return idle_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool idle_ = false;
};

bool has_line(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(FrontDoor, QuotaRefusesBeforeAdmissionAndFinishRefundsWhatWasNotUsed) {
  REQUIRE_MODEL();
  FrontDoorConfig cfg = base_cfg();
  cfg.tenant_quotas = {{"small", TenantQuota{.tokens_per_minute = 60, .burst_tokens = 100, .max_concurrent = 0}}};
  ASSERT_TRUE(validate(cfg).ok());
  FrontDoor door(cfg);
  ASSERT_TRUE(door.add_model(served("m")).ok());
  auto m = door.resolve("m");
  ASSERT_TRUE(m);
  EXPECT_EQ(door.resolve(""), m);  // no name: the default model
  EXPECT_EQ(door.resolve("nope"), nullptr);
  const CallRequest r = req(m, "small", SlaClass::kStandard, 20, 60);  // charged 80 of 100
  Decision first = door.admit(r);
  ASSERT_TRUE(first.admit);
  ASSERT_TRUE(first.call);
  Decision d = door.admit(r);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.http_status, 429);
  EXPECT_EQ(d.reason, kReasonTenantRate);
  EXPECT_NEAR(d.retry_after_s, 60.0, 1.0);  // 80 needed, 20 left, 1 token/s
  EXPECT_NE(d.message.find("tokens-per-minute"), std::string::npos);
  EXPECT_EQ(d.call, nullptr);
  // The refused request took no queue place: only the first one is queued.
  EXPECT_EQ(m->admission->state().requests[1], 1);
  EXPECT_EQ(door.inflight_choices(), 1);
  // It used 30 of its 80: 50 come back, and a request of 70 fits again.
  first.call->first_token();
  EXPECT_EQ(m->admission->state().requests[1], 0);
  first.call->finish({.completed = true, .prompt_tokens = 20, .completion_tokens = 10});
  EXPECT_EQ(door.inflight_choices(), 0);
  Decision again = door.admit(req(m, "small", SlaClass::kStandard, 10, 60));
  EXPECT_TRUE(again.admit);
  // Other tenants are unlimited by default.
  EXPECT_TRUE(door.admit(req(m, "big", SlaClass::kStandard, 10, 100000)).admit);
  const std::string text = door.metrics().render();
  EXPECT_TRUE(has_line(text, R"(metro_class_rejections_total{model="m",class="standard",reason="tenant_tokens_per_minute"} 1)"))
      << text;
}

TEST(FrontDoor, AdmissionRefusalRefundsTheQuotaChargeAndTheCallEndsOnce) {
  REQUIRE_MODEL();
  FrontDoorConfig cfg = base_cfg();
  cfg.tenant_quotas = {{"t", TenantQuota{.tokens_per_minute = 600, .burst_tokens = 1000, .max_concurrent = 2}}};
  FrontDoor door(cfg);
  ASSERT_TRUE(door.add_model(served("m")).ok());
  auto m = door.resolve("m");
  // Realtime objective 0.5 s at 1000 tok/s: a 300-token prompt alone is predicted at
  // ~0.31 s, behind another one at ~0.61 s: refused for the load (503), not for itself.
  Decision first = door.admit(req(m, "t", SlaClass::kRealtime, 300, 10));
  ASSERT_TRUE(first.admit) << first.reason;
  Decision d = door.admit(req(m, "t", SlaClass::kRealtime, 300, 10, /*start=*/900));
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.http_status, 503);
  EXPECT_EQ(d.reason, kReasonTtft);
  first.call->finish({});
  // Neither its tokens nor its concurrency slot stay charged: two requests of 450 fit.
  Decision a = door.admit(req(m, "t", SlaClass::kBatch, 440, 10));
  Decision b = door.admit(req(m, "t", SlaClass::kBatch, 440, 10));
  ASSERT_TRUE(a.admit && b.admit);
  EXPECT_EQ(door.admit(req(m, "t", SlaClass::kBatch, 1, 1)).reason, kReasonTenantConcurrency);
  // A call dropped without finish() (its session went away) ends as not completed: its
  // slot and queue place come back exactly once.
  a.call.reset();
  EXPECT_EQ(m->admission->state().requests[2], 1);
  b.call->finish({});
  b.call->finish({});  // idempotent
  b.call.reset();
  EXPECT_EQ(m->admission->state().requests[2], 0);
  EXPECT_EQ(door.inflight_choices(), 0);
  EXPECT_TRUE(door.admit(req(m, "t", SlaClass::kBatch, 1, 1)).admit);
}

// The tenant's concurrency slot is taken before its request is parsed and tokenized
// (enter), and admit() takes that slot over instead of taking a second one.
TEST(FrontDoor, TheTenantSlotIsTakenBeforeTokenizing) {
  REQUIRE_MODEL();
  FrontDoorConfig cfg = base_cfg();
  cfg.tenant_quotas = {{"one", TenantQuota{.tokens_per_minute = 0, .burst_tokens = 0, .max_concurrent = 1}}};
  FrontDoor door(cfg);
  ASSERT_TRUE(door.add_model(served("m")).ok());
  auto m = door.resolve("m");
  std::shared_ptr<TenantSlot> slot, second;
  ASSERT_TRUE(door.enter("one", SlaClass::kStandard, &slot).admit);
  ASSERT_TRUE(slot);
  Decision busy = door.enter("one", SlaClass::kStandard, &second);
  EXPECT_FALSE(busy.admit);
  EXPECT_EQ(busy.http_status, 429);
  EXPECT_EQ(busy.reason, kReasonTenantConcurrency);
  EXPECT_FALSE(second);
  EXPECT_TRUE(door.enter("other", SlaClass::kStandard, &second).admit) << "other tenants are not held";
  second.reset();
  slot.reset();  // dropped unused (the request failed to parse): the slot comes back
  ASSERT_TRUE(door.enter("one", SlaClass::kStandard, &slot).admit);
  CallRequest r = req(m, "one", SlaClass::kStandard, 10, 2);
  r.slot = slot;
  Decision d = door.admit(r);
  ASSERT_TRUE(d.admit) << d.reason;
  slot.reset();
  r.slot.reset();  // taken over: dropping it now gives nothing back
  EXPECT_EQ(door.quotas().state("one", now_ns()).in_flight, 1);
  EXPECT_FALSE(door.enter("one", SlaClass::kStandard, &second).admit);
  d.call->finish({});
  EXPECT_EQ(door.quotas().state("one", now_ns()).in_flight, 0);
  EXPECT_TRUE(door.enter("one", SlaClass::kStandard, &second).admit);
}

TEST(FrontDoor, PrefixCacheHitsAreNotQueuedWorkButAreCharged) {
  REQUIRE_MODEL();
  FrontDoorConfig cfg = base_cfg();
  cfg.sla.of(SlaClass::kRealtime).ttft_s = 0.05;
  cfg.tenant_quotas = {{"t", TenantQuota{.tokens_per_minute = 600, .burst_tokens = 1000, .max_concurrent = 0}}};
  FrontDoor door(cfg);
  ASSERT_TRUE(door.add_model(served("m")).ok());
  auto m = door.resolve("m");
  // 100 prompt tokens at 1000 tok/s: 0.11 s predicted even on this idle engine, over a
  // 0.05 s objective: no wait would help (400).
  const CallRequest r = req(m, "t", SlaClass::kRealtime, 100, 4);
  Decision cold = door.admit(r);
  EXPECT_EQ(cold.http_status, 400);
  EXPECT_EQ(cold.reason, kReasonTooLongForClass);
  // The engine computes the same prompt once; its 96 leading tokens (6 blocks) are cached.
  // The steps just run teach admission this machine's rates (slow under sanitizers). Once
  // the report of the step that ended the request has reached every observer (the one
  // added here is called after admission's), pin the rates again, so the decision below
  // turns on the queued tokens alone.
  auto idle = std::make_shared<IdleWatch>();
  m->engine->add_observer(idle);
  ASSERT_EQ(collect(*m->engine->submit(r.requests.front())).tokens.size(), 4u);
  idle->wait();
  m->admission->calibrate(1000.0, 0.01);
  Decision d = door.admit(r);
  ASSERT_TRUE(d.admit) << d.reason;
  EXPECT_EQ(m->admission->state().prompt_tokens[0], 4);  // only the uncached tail is queued
  // Charged the whole prompt all the same: 2 x 104 tokens so far of the 1000-token bucket.
  d.call->first_token();
  EXPECT_EQ(m->admission->state().prompt_tokens[0], 0);
}

// Admission models the queue in the engine's own order: with the SLA policy a quiet tenant
// is admitted past a class that one tenant's flood filled; with FCFS the class is one queue.
TEST(FrontDoor, FairnessFollowsTheEnginesPolicy) {
  REQUIRE_MODEL();
  FrontDoorConfig cfg = base_cfg();
  cfg.admission_cfg.limits[1] = {.max_requests = 4, .max_prompt_tokens = 1 << 20};
  cfg.sla.of(SlaClass::kStandard).ttft_s = 100.0;
  FrontDoor door(cfg);
  ASSERT_TRUE(door.add_model(served("sla")).ok());
  engine::EngineConfig fcfs;
  fcfs.sched = "fcfs";
  ASSERT_TRUE(door.add_model(served("fcfs", fcfs)).ok());
  for (const char* name : {"sla", "fcfs"}) {
    auto m = door.resolve(name);
    std::vector<std::shared_ptr<Call>> held;
    for (int i = 0; i < 4; ++i) {
      Decision d = door.admit(req(m, "loud", SlaClass::kStandard, 100, 10));
      ASSERT_TRUE(d.admit);
      held.push_back(d.call);
    }
    EXPECT_EQ(door.admit(req(m, "loud", SlaClass::kStandard, 100, 10)).reason, kReasonQueueFull);
    Decision quiet = door.admit(req(m, "quiet", SlaClass::kStandard, 100, 10));
    if (std::string(name) == "sla") {
      EXPECT_TRUE(quiet.admit) << "below its share of the full class";
    } else {
      EXPECT_EQ(quiet.reason, kReasonQueueFull) << "FCFS: one queue for everybody";
    }
  }
}

// The engine's step reports reach the model's admission control.
TEST(FrontDoor, StepReportsMoveThePrediction) {
  REQUIRE_MODEL();
  FrontDoorConfig cfg = base_cfg();
  cfg.admission_cfg.initial_prefill_tokens_per_s = 1.0;  // far below any real engine
  FrontDoor door(cfg);
  ASSERT_TRUE(door.add_model(served("m")).ok());
  auto m = door.resolve("m");
  ASSERT_EQ(collect(*m->engine->submit(greedy_request(tokens(64), 2))).tokens.size(), 2u);
  for (int i = 0; i < 200 && m->admission->state().prefill_tokens_per_s <= 1.0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the engine thread reports
  }
  // One step moves the estimate a fifth of the way to the measured rate: even a sanitizer
  // build's tens of tokens per second at least double it.
  EXPECT_GT(m->admission->state().prefill_tokens_per_s, 2.0);
}

// An admitted request carries admission's promise into the engine: still without a first
// token at shed_after x its class's bound, it ends with deadline_missed; and while it waits
// past the bound its class takes no more.
TEST(FrontDoor, AnAdmittedRequestPastItsBoundIsShedAndItsClassWaits) {
  REQUIRE_MODEL();
  FrontDoorConfig cfg = base_cfg();
  cfg.sla.of(SlaClass::kBatch).ttft_s = 0.4;
  cfg.admission_cfg.ttft_margin = 1.0;
  cfg.admission_cfg.shed_after = 2.0;  // ended 0.8 s after admission
  FrontDoor door(cfg);
  engine::EngineConfig one_seat;
  one_seat.max_seqs = 1;
  ASSERT_TRUE(door.add_model(served("m", one_seat)).ok());
  auto m = door.resolve("m");
  // The seat's holder: long enough to outlast the second request's deadline.
  CallRequest first = req(m, "", SlaClass::kBatch, 8, sanitized() ? 200 : 600);
  first.requests.front().stop.ignore_eos = true;
  Decision d1 = door.admit(first);
  ASSERT_TRUE(d1.admit);
  std::vector<engine::Handle> h1, h2;
  d1.call->submit(first.requests, [&](Expected<std::vector<engine::Handle>> hs) { h1 = std::move(*hs); });
  ASSERT_EQ(h1.size(), 1u);
  auto ev = h1[0].stream->pop(std::chrono::milliseconds(60000));  // running: its first token is out
  ASSERT_TRUE(ev.has_value());
  d1.call->first_token();
  const CallRequest second = req(m, "", SlaClass::kBatch, 8, 4);
  const int64_t t0 = now_ns();
  Decision d2 = door.admit(second);
  ASSERT_TRUE(d2.admit) << d2.reason;
  d2.call->submit(second.requests, [&](Expected<std::vector<engine::Handle>> hs) { h2 = std::move(*hs); });
  ASSERT_EQ(h2.size(), 1u);
  // Past the bound (0.4 s) and still waiting: the class refuses, though its queue is short.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  Decision d3 = door.admit(req(m, "", SlaClass::kBatch, 8, 4));
  EXPECT_FALSE(d3.admit);
  EXPECT_EQ(d3.reason, kReasonTtft);
  engine::Event fin;
  for (;;) {
    auto e = h2[0].stream->pop(std::chrono::milliseconds(60000));
    ASSERT_TRUE(e.has_value());
    if (e->kind == engine::Event::Kind::kFinish) fin = *e;
    if (e->kind == engine::Event::Kind::kDone) break;
  }
  const double waited = static_cast<double>(now_ns() - t0) * 1e-9;
  EXPECT_EQ(fin.reason, engine::FinishReason::kAbort);
  EXPECT_EQ(fin.code, "deadline_missed");
  EXPECT_GE(waited, 0.75);
  d2.call->finish(CallOutcome{});
  // It left the queue (whether the class takes more now is the prediction's call: with the
  // one seat held, batch drains nothing).
  EXPECT_EQ(m->admission->state().requests[2], 0);
  EXPECT_EQ(m->admission->state().oldest_wait_s[2], 0.0);
  const testing::Generation g = collect(h1[0]);
  EXPECT_EQ(g.reason, engine::FinishReason::kLength) << "the request ahead was disturbed";
}

TEST(FrontDoor, DeadlinesAdmissionModesAndTheChoiceBound) {
  REQUIRE_MODEL();
  {
    FrontDoor on(base_cfg());
    ASSERT_TRUE(on.add_model(served("m")).ok());
    CallRequest r = req(on.resolve("m"), "", SlaClass::kBatch, 100, 10);
    r.deadline_ns = now_ns() + 10'000'000;  // 10 ms from now; 100 tokens take ~100 ms
    Decision d = on.admit(r);
    EXPECT_FALSE(d.admit);
    EXPECT_EQ(d.reason, kReasonDeadline);
  }
  {
    FrontDoorConfig cfg = base_cfg();
    cfg.admission = AdmissionMode::kOff;
    cfg.max_inflight_choices = 3;
    FrontDoor off(cfg);
    ASSERT_TRUE(off.add_model(served("m")).ok());
    auto m = off.resolve("m");
    EXPECT_EQ(m->admission, nullptr);
    // Off, a huge queue is admitted (a conventional server), up to the bound on choices.
    std::vector<Decision> held;
    for (int i = 0; i < 3; ++i) held.push_back(off.admit(req(m, "", SlaClass::kRealtime, 4000, 10)));
    for (const Decision& d : held) EXPECT_TRUE(d.admit);
    Decision over = off.admit(req(m, "", SlaClass::kRealtime, 1, 1));
    EXPECT_FALSE(over.admit);
    EXPECT_EQ(over.http_status, 503);
    EXPECT_EQ(over.reason, kReasonOverloaded);
    EXPECT_GE(over.retry_after_s, 1.0);
    held.clear();
    EXPECT_EQ(off.inflight_choices(), 0);
    EXPECT_TRUE(off.admit(req(m, "", SlaClass::kRealtime, 1, 1)).admit);
  }
  {
    // Auto: on for a policy that serves classes in priority order, off for FCFS.
    FrontDoorConfig cfg = base_cfg();
    cfg.admission = AdmissionMode::kAuto;
    FrontDoor door(cfg);
    engine::EngineConfig fcfs;
    fcfs.sched = "fcfs";
    ASSERT_TRUE(door.add_model(served("sla")).ok());
    ASSERT_TRUE(door.add_model(served("fcfs", fcfs)).ok());
    EXPECT_NE(door.resolve("sla")->admission, nullptr);
    EXPECT_EQ(door.resolve("fcfs")->admission, nullptr);
  }
  FrontDoorConfig bad = base_cfg();
  bad.tenant_quotas = {{"bad-tenant", TenantQuota{.tokens_per_minute = -5}}};
  Status s = validate(bad);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("bad-tenant"), std::string::npos);
}

// Two engines in one registry on one shared compute pool: both serve at once, each gives
// what it gives alone, each has its own series on /metrics.
TEST(FrontDoor, TwoEnginesShareOnePoolAndTheRegistry) {
  REQUIRE_MODEL();
  auto pool = std::make_shared<ThreadPool>(2);
  engine::EngineConfig shared;
  shared.pool = pool;
  FrontDoorConfig cfg = base_cfg();
  FrontDoor door(cfg);
  ASSERT_TRUE(door.add_model(served("a", shared)).ok());
  ASSERT_TRUE(door.add_model(served("b", shared)).ok());
  auto dup = served("a");
  EXPECT_FALSE(door.add_model(dup).ok());  // one name, one primary
  auto canary = served("a");
  canary->variant = "canary";
  ASSERT_TRUE(door.add_model(canary).ok());
  EXPECT_EQ(door.models().size(), 3u);
  EXPECT_EQ(door.resolve("a")->variant, "");
  ASSERT_EQ(door.models().variants("a").size(), 2u);
  EXPECT_EQ(door.models().variants("a")[1]->id(), "a@canary");

  // What one engine of its own gives, then both shared engines at once.
  const std::vector<int32_t> p1 = tokens(40, 700), p2 = tokens(33, 900);
  auto alone = served("alone");
  const auto want1 = collect(*alone->engine->submit(greedy_request(p1, 12))).tokens;
  const auto want2 = collect(*alone->engine->submit(greedy_request(p2, 12))).tokens;
  auto a = door.resolve("a");
  auto b = door.resolve("b");
  std::vector<engine::Handle> ha, hb;
  for (int i = 0; i < 3; ++i) {
    ha.push_back(*a->engine->submit(greedy_request(p1, 12)));
    hb.push_back(*b->engine->submit(greedy_request(p2, 12)));
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(collect(ha[static_cast<size_t>(i)]).tokens, want1);
    EXPECT_EQ(collect(hb[static_cast<size_t>(i)]).tokens, want2);
  }
  EXPECT_GT(a->engine->stats().steps, 0u);
  EXPECT_GT(b->engine->stats().steps, 0u);
  const std::string text = door.metrics().render();
  EXPECT_TRUE(has_line(text, R"(metro_generation_tokens_total{model="a"} 36)")) << text;
  EXPECT_TRUE(has_line(text, R"(metro_generation_tokens_total{model="b"} 36)")) << text;
  EXPECT_TRUE(has_line(text, R"(metro_generation_tokens_total{model="a@canary"} 0)")) << text;
  // One HELP/TYPE header per family however many engines write it.
  size_t headers = 0;
  for (size_t at = 0; (at = text.find("# TYPE metro_generation_tokens_total ", at)) != std::string::npos; ++at) {
    ++headers;
  }
  EXPECT_EQ(headers, 1u);
  EXPECT_TRUE(has_line(text, "metro_model_loaded 1"));
}

}  // namespace
}  // namespace metro::gateway
