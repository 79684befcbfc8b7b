#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>

#include "base/hash.h"
#include "sched/sched_metrics.h"
#include "sched/sla_scheduler.h"

namespace metro::sched {
namespace {

// A step-by-step harness: each step() plans, "computes" and samples one fake token for
// chunks that reach their sequence's end; a sequence finishes at max_new_tokens.
struct Harness {
  kv::KvCacheManager kv;
  std::unique_ptr<SlaScheduler> s;
  std::vector<std::unique_ptr<SeqState>> seqs;
  int64_t now_ns = 0;
  int64_t step_ns = 10'000'000;  // 10 ms per step unless a test says otherwise

  Harness(int n_blocks, int block_size, SlaSchedulerConfig cfg)
      : kv({.n_blocks = n_blocks, .block_size = block_size}), s(make_sla_scheduler(cfg, kv)) {}

  SeqState* add(SlaClass cls, int n_prompt, int max_new, const std::string& tenant = "t",
                uint64_t prefix_hash = 0) {
    auto q = std::make_unique<SeqState>();
    q->id = seqs.size() + 1;
    q->tokens.resize(static_cast<size_t>(n_prompt));
    for (int i = 0; i < n_prompt; ++i) {
      q->tokens[static_cast<size_t>(i)] = static_cast<int32_t>(mix64(q->id * 1000003 + i) & 0xffffff);
    }
    q->n_prompt = n_prompt;
    q->max_new_tokens = max_new;
    q->sla_class = cls;
    q->tenant = tenant;
    q->prefix_hash = prefix_hash;
    q->arrival_ns = now_ns + 1;  // > 0: stamped arrival
    s->add(q.get());
    seqs.push_back(std::move(q));
    return seqs.back().get();
  }

  StepPlan step() {
    StepPlan plan = s->schedule(now_ns);
    std::vector<bool> samples;
    for (auto& ss : plan.seqs) {
      EXPECT_GE(kv.n_slots(ss.seq->id), ss.seq->n_computed + ss.n_tokens) << "scheduled without KV";
      samples.push_back(ss.samples());
    }
    for (SeqState* v : plan.preempted) {
      for (auto& ss : plan.seqs) EXPECT_NE(ss.seq, v) << "a victim was also planned";
      EXPECT_EQ(kv.n_slots(v->id), 0);
    }
    s->update(plan);
    now_ns += step_ns;
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      SeqState* q = plan.seqs[i].seq;
      if (!samples[i]) continue;
      q->tokens.push_back(static_cast<int32_t>(q->id * 7 + q->tokens.size()));
      if (q->n_generated() >= q->max_new_tokens) s->finish(q);
    }
    return plan;
  }

  bool all_finished() const {
    return std::all_of(seqs.begin(), seqs.end(), [](auto& q) { return q->status == SeqStatus::kFinished; });
  }
  static bool has(const StepPlan& p, const SeqState* q) {
    return std::any_of(p.seqs.begin(), p.seqs.end(), [&](auto& ss) { return ss.seq == q; });
  }
};

SlaSchedulerConfig small_cfg(int tokens, int seqs) {
  SlaSchedulerConfig c;
  c.base = {.max_batch_tokens = tokens, .max_seqs = seqs, .max_logits = seqs};
  return c;
}

TEST(SlaScheduler, AdmitsByClassWhateverTheArrivalOrder) {
  Harness h(256, 16, small_cfg(512, 1));
  SeqState* b = h.add(SlaClass::kBatch, 8, 2);
  SeqState* st = h.add(SlaClass::kStandard, 8, 2);
  SeqState* rt = h.add(SlaClass::kRealtime, 8, 2);
  std::vector<const SeqState*> first_scheduled;
  while (!h.all_finished()) {
    StepPlan p = h.step();
    for (auto& ss : p.seqs) {
      if (std::find(first_scheduled.begin(), first_scheduled.end(), ss.seq) == first_scheduled.end()) {
        first_scheduled.push_back(ss.seq);
      }
    }
  }
  ASSERT_EQ(first_scheduled.size(), 3u);
  EXPECT_EQ(first_scheduled[0], rt);
  EXPECT_EQ(first_scheduled[1], st);
  EXPECT_EQ(first_scheduled[2], b);
  EXPECT_EQ(h.kv.stats().blocks_used, 0);
}

TEST(SlaScheduler, RealtimePrefillIsNeverStuckBehindBatchPrefill) {
  for (bool exclusive : {true, false}) {
    SlaSchedulerConfig cfg = small_cfg(64, 8);
    cfg.realtime_prefill_exclusive = exclusive;
    Harness h(1024, 16, cfg);
    SeqState* b = h.add(SlaClass::kBatch, 1000, 4);
    h.step();  // b takes the whole budget
    EXPECT_EQ(b->n_computed, 64);
    SeqState* rt = h.add(SlaClass::kRealtime, 40, 4);
    StepPlan p = h.step();
    ASSERT_GE(p.seqs.size(), 1u);
    EXPECT_EQ(p.seqs[0].seq, rt);
    EXPECT_EQ(p.seqs[0].n_tokens, 40);  // the whole realtime prompt first
    EXPECT_EQ(rt->n_generated(), 1);
    if (exclusive) {
      EXPECT_EQ(p.seqs.size(), 1u) << "nothing of lower classes lengthens a realtime prefill step";
    } else {
      ASSERT_EQ(p.seqs.size(), 2u);
      EXPECT_EQ(p.seqs[1].seq, b);  // batch gets what is left
      EXPECT_EQ(p.seqs[1].n_tokens, 24);
    }
    // Next step: the realtime decode comes first, batch prefill continues with the rest.
    StepPlan p2 = h.step();
    ASSERT_EQ(p2.seqs.size(), 2u);
    EXPECT_EQ(p2.seqs[0].seq, rt);
    EXPECT_EQ(p2.seqs[0].n_tokens, 1);
    EXPECT_EQ(p2.seqs[1].seq, b);
    EXPECT_EQ(p2.seqs[1].n_tokens, 63);
  }
}

TEST(SlaScheduler, RealtimeArrivalPausesBatchDecodesWhenBudgetIsShort) {
  // Budget 4 tokens: three batch decodes (the seats a decode share of 3/4 allows). A
  // realtime arrival takes the whole budget; the batch decodes are paused, not preempted:
  // they keep their blocks.
  SlaSchedulerConfig cfg = small_cfg(4, 8);
  cfg.decode_share = 0.75;
  Harness h(256, 16, cfg);
  std::vector<SeqState*> batch;
  for (int i = 0; i < 4; ++i) batch.push_back(h.add(SlaClass::kBatch, 1, 50));
  for (int i = 0; i < 3; ++i) h.step();
  EXPECT_EQ(batch[3]->status, SeqStatus::kWaiting) << "no seat: decodes would take the whole budget";
  batch.pop_back();
  for (SeqState* b : batch) ASSERT_EQ(b->status, SeqStatus::kRunning);
  SeqState* rt = h.add(SlaClass::kRealtime, 4, 2);
  StepPlan p = h.step();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].seq, rt);
  EXPECT_TRUE(p.preempted.empty());
  for (SeqState* b : batch) {
    EXPECT_EQ(b->status, SeqStatus::kRunning);
    EXPECT_EQ(h.kv.n_slots(b->id), b->n_computed) << "a paused sequence keeps its blocks";
  }
}

TEST(SlaScheduler, DecodeShareSetsTheSeats) {
  // The same four batch requests with budget 4: decode_share 1 (--decode-share 1) seats all
  // four, 0.5 only two; the others wait without blocks.
  for (const auto& [share, seated] : {std::pair{1.0, 4}, std::pair{0.5, 2}}) {
    SlaSchedulerConfig cfg = small_cfg(4, 8);
    cfg.decode_share = share;
    Harness h(256, 16, cfg);
    std::vector<SeqState*> batch;
    for (int i = 0; i < 4; ++i) batch.push_back(h.add(SlaClass::kBatch, 1, 50));
    for (int i = 0; i < 4; ++i) h.step();
    int running = 0;
    for (SeqState* b : batch) {
      if (b->status == SeqStatus::kRunning) {
        ++running;
      } else {
        EXPECT_EQ(h.kv.n_slots(b->id), 0) << "a request without a seat holds no blocks";
      }
    }
    EXPECT_EQ(running, seated) << "decode_share " << share;
  }
}

TEST(SlaScheduler, RealtimePreemptsBatchWhenMemoryIsShort) {
  // 8 blocks of 4 tokens; two batch requests hold all 32 slots. A realtime arrival frees one
  // (preemption with recompute) and runs; batch finishes later all the same.
  Harness h(8, 4, small_cfg(64, 8));
  SeqState* b1 = h.add(SlaClass::kBatch, 12, 8);
  SeqState* b2 = h.add(SlaClass::kBatch, 12, 8);
  for (int i = 0; i < 4; ++i) h.step();
  ASSERT_EQ(h.kv.n_free_blocks(), 0);
  SeqState* rt = h.add(SlaClass::kRealtime, 6, 3);
  StepPlan p = h.step();
  EXPECT_TRUE(Harness::has(p, rt));
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_TRUE(p.preempted[0] == b1 || p.preempted[0] == b2);
  EXPECT_EQ(p.preempted[0]->status, SeqStatus::kWaiting);
  for (int guard = 0; guard < 500 && !h.all_finished(); ++guard) h.step();
  EXPECT_TRUE(h.all_finished());
  EXPECT_EQ(b1->n_generated(), 8);
  EXPECT_EQ(b2->n_generated(), 8);
  EXPECT_EQ(h.s->counts().preemptions,
            static_cast<uint64_t>(b1->n_preemptions + b2->n_preemptions + rt->n_preemptions));
}

TEST(SlaScheduler, SameClassArrivalWaitsInsteadOfPreempting) {
  Harness h(8, 4, small_cfg(64, 8));
  h.add(SlaClass::kStandard, 12, 8);
  h.add(SlaClass::kStandard, 12, 8);
  for (int i = 0; i < 4; ++i) h.step();
  SeqState* late = h.add(SlaClass::kStandard, 6, 3);
  StepPlan p = h.step();
  EXPECT_TRUE(p.preempted.empty());
  EXPECT_FALSE(Harness::has(p, late));
  EXPECT_EQ(late->status, SeqStatus::kWaiting);
  for (int guard = 0; guard < 500 && !h.all_finished(); ++guard) h.step();
  EXPECT_TRUE(h.all_finished());
}

TEST(SlaScheduler, LongGenerationDropsALevel) {
  // Two seats per step and a realtime request taking one of them every step: the standard
  // decodes a and b compete for the other. Quantum 8 work tokens (a prompt token costs 1).
  SlaSchedulerConfig cfg = small_cfg(64, 2);
  cfg.max_running_seqs = 4;
  cfg.sla.of(SlaClass::kStandard).quantum_tokens = 8;
  Harness h(256, 16, cfg);
  SeqState* a = h.add(SlaClass::kStandard, 2, 60);
  SeqState* b = h.add(SlaClass::kStandard, 2, 200);
  h.step();
  ASSERT_EQ(a->n_generated(), 1);
  ASSERT_EQ(b->n_generated(), 1);
  auto step_beside_realtime = [&] {
    h.add(SlaClass::kRealtime, 1, 1);
    return h.step();
  };
  // Same level: a is predicted to finish sooner (max_tokens 60 vs 200), so a goes first.
  while (a->n_generated() < 7) {
    StepPlan p = step_beside_realtime();
    EXPECT_TRUE(Harness::has(p, a));
    EXPECT_FALSE(Harness::has(p, b));
  }
  // 2 prompt + 7 generated = 9 > quantum 8: a drops to level 1 and b, still at level 0, goes
  // first although it is predicted to run longer. a is paused, not preempted.
  EXPECT_EQ(h.s->level_of(a), 1);
  EXPECT_EQ(h.s->level_of(b), 0);
  StepPlan p = step_beside_realtime();
  EXPECT_TRUE(Harness::has(p, b));
  EXPECT_FALSE(Harness::has(p, a));
  EXPECT_EQ(a->status, SeqStatus::kRunning);
  while (b->n_generated() < 7) step_beside_realtime();
  // Both at level 1: shortest predicted remaining first again.
  p = step_beside_realtime();
  EXPECT_TRUE(Harness::has(p, a));
  // Levels double: level 1 holds up to 8 + 16 = 24 work tokens, level 2 up to 24 + 32.
  while (a->n_generated() < 22) step_beside_realtime();
  EXPECT_EQ(h.s->level_of(a), 1);  // 2 + 22 = 24
  while (a->n_generated() < 23) step_beside_realtime();
  EXPECT_EQ(h.s->level_of(a), 2);  // 25
  for (int guard = 0; guard < 1000 && !h.all_finished(); ++guard) h.step();
  EXPECT_TRUE(h.all_finished());
}

TEST(SlaScheduler, ShortestPredictedFirstInsideALevel) {
  auto predictor = std::make_shared<BucketQuantilePredictor>();
  const uint64_t short_tpl = 11, long_tpl = 22;
  for (int i = 0; i < 20; ++i) {
    predictor->observe({.n_prompt = 16, .max_new_tokens = 512, .sla_class = SlaClass::kStandard,
                        .tenant_hash = 0, .prefix_hash = short_tpl}, 5 + i % 3);
    predictor->observe({.n_prompt = 16, .max_new_tokens = 512, .sla_class = SlaClass::kStandard,
                        .tenant_hash = 0, .prefix_hash = long_tpl}, 400 + i);
  }
  SlaSchedulerConfig cfg = small_cfg(512, 1);
  cfg.predictor = predictor;
  Harness h(512, 16, cfg);
  SeqState* blocker = h.add(SlaClass::kStandard, 4, 1);
  SeqState* lng = h.add(SlaClass::kStandard, 16, 512, "t", long_tpl);
  SeqState* sht = h.add(SlaClass::kStandard, 16, 512, "t", short_tpl);  // arrives last
  EXPECT_LT(sht->predicted_output_tokens, 10);
  EXPECT_GT(lng->predicted_output_tokens, 350);
  StepPlan p = h.step();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].seq, blocker);  // the shortest of all
  p = h.step();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].seq, sht);
  EXPECT_EQ(lng->status, SeqStatus::kWaiting);
}

TEST(SlaScheduler, FinishTeachesThePredictorAbortDoesNot) {
  SlaConfig sla;
  SchedMetrics metrics(sla);
  SlaSchedulerConfig cfg = small_cfg(256, 8);
  cfg.metrics = &metrics;
  Harness h(256, 16, cfg);
  SeqState* done = h.add(SlaClass::kRealtime, 4, 3);
  SeqState* aborted = h.add(SlaClass::kRealtime, 4, 30);
  h.step();
  h.step();
  h.step();
  ASSERT_EQ(done->status, SeqStatus::kFinished);
  EXPECT_EQ(h.s->predictor().version(), 1u);
  h.s->remove(aborted);
  EXPECT_EQ(h.s->predictor().version(), 1u);
  EXPECT_EQ(aborted->status, SeqStatus::kFinished);
  EXPECT_EQ(h.kv.stats().blocks_used, 0);
  SchedMetricsSnapshot snap = metrics.snapshot();
  EXPECT_EQ(snap.classes[0].predictor.n, 1);
  EXPECT_EQ(snap.predictor.n, 1);
}

TEST(SlaScheduler, VtcLiftsANewTenantAndChargesService) {
  Harness h(1024, 16, small_cfg(64, 8));
  h.add(SlaClass::kStandard, 32, 4, "a");
  h.step();
  const double a = h.s->tenant_counter(SlaClass::kStandard, "a");
  EXPECT_DOUBLE_EQ(a, 32.0 + 2.0);  // 32 prompt tokens x 1 + one output token x 2
  h.add(SlaClass::kStandard, 8, 4, "b");
  EXPECT_DOUBLE_EQ(h.s->tenant_counter(SlaClass::kStandard, "b"), a) << "lifted to the active minimum";
}

TEST(SlaScheduler, StepBudgetFollowsTheTightestObjective) {
  SlaSchedulerConfig cfg = small_cfg(256, 64);
  cfg.cost = {.fixed_s = 0.006, .per_prefill_token_s = 0.0025, .per_decode_seq_s = 0.0025};
  cfg.class_memory_s = 0.0;
  cfg.tpot_slack = false;  // the budget at pace; slack's own tests are below
  Harness h(1024, 16, cfg);
  h.add(SlaClass::kBatch, 400, 10);
  h.step();
  // Batch only: TTFT 30 s / 4 allows far more than 256 tokens.
  EXPECT_EQ(h.s->last_step_budget(), 256);
  h.add(SlaClass::kRealtime, 10, 10);
  h.step();
  // Realtime present: 0.5 s / 4 = 125 ms -> (0.125 - 0.006) / 0.0025 = 47 tokens.
  EXPECT_EQ(h.s->last_step_budget(), 47);
  h.step();
  // Realtime decoding: 0.8 x its TPOT 0.1 s -> (0.08 - 0.006) / 0.0025 = 29 tokens.
  EXPECT_EQ(h.s->last_step_budget(), 29);
}

// The adaptive controller's batch budget: a factor on the step's time target; the token
// budget follows it down, never above max_batch_tokens.
TEST(SlaScheduler, StepScaleStretchesAndShrinksTheBudget) {
  SlaSchedulerConfig cfg = small_cfg(256, 64);
  cfg.cost = {.fixed_s = 0.006, .per_prefill_token_s = 0.0025, .per_decode_seq_s = 0.0025};
  cfg.class_memory_s = 0.0;
  cfg.tpot_slack = false;
  Harness h(1024, 16, cfg);
  h.add(SlaClass::kBatch, 4000, 10);
  h.s->set_step_scale(0.5);
  h.step();
  EXPECT_EQ(h.s->last_step_budget(), 128);  // no objective binds: half of max_batch_tokens
  h.s->set_step_scale(3.0);
  h.step();
  EXPECT_EQ(h.s->last_step_budget(), 256);  // never above it
  h.s->set_step_scale(1.0);
  h.add(SlaClass::kRealtime, 10, 20);
  h.step();
  h.step();
  EXPECT_EQ(h.s->last_step_budget(), 29);  // realtime decoding: (0.08 - 0.006) / 0.0025
  h.s->set_step_scale(2.0);
  const StepPlan wide = h.step();
  EXPECT_EQ(h.s->last_step_budget(), 61);  // (2 x 0.08 - 0.006) / 0.0025
  EXPECT_EQ(wide.n_tokens, 61);            // the batch prompt fills it
  h.s->set_step_scale(0.5);
  h.step();
  EXPECT_EQ(h.s->last_step_budget(), 16);  // 0.04 s would fit 13: min_step_tokens
}

// Attention makes a prompt's later chunks dearer: with an attention term in the cost model
// every chunk is the longest that fits the step's time at its own position, so chunks of a
// long prompt shrink as it advances; without the term they stay the same size.
TEST(SlaScheduler, ChunksFitTheStepTimeAtTheirPosition) {
  for (double pair_s : {0.0, 1e-6}) {
    SCOPED_TRACE(pair_s);
    SlaSchedulerConfig cfg = small_cfg(512, 8);
    cfg.cost = {.fixed_s = 0.006, .per_prefill_token_s = 0.0025, .per_decode_seq_s = 0.0025,
                .per_attention_pair_s = pair_s};
    Harness h(1024, 16, cfg);
    SeqState* q = h.add(SlaClass::kStandard, 1200, 4);
    const double time = 2.0 * cfg.step_per_ttft - cfg.cost.fixed_s;  // standard TTFT 2 s
    std::vector<int> chunks;
    while (q->n_computed < q->n_prompt) {
      const int pos = q->n_computed;
      StepPlan p = h.step();
      ASSERT_EQ(p.seqs.size(), 1u);
      const int n = p.seqs[0].n_tokens;
      chunks.push_back(n);
      if (pos + n < q->n_prompt) {  // not the prompt's tail: exactly the longest that fits
        EXPECT_LE(cfg.cost.prefill_s(n, pos), time) << "chunk at " << pos;
        EXPECT_GT(cfg.cost.prefill_s(n + 1, pos), time) << "chunk at " << pos;
      }
    }
    ASSERT_GE(chunks.size(), 4u);
    if (pair_s == 0.0) {
      EXPECT_EQ(chunks[0], 197);  // 0.494 s / 2.5 ms
      EXPECT_EQ(chunks[1], chunks[0]);
    } else {
      EXPECT_LT(chunks[0], 197);
      for (size_t i = 1; i + 1 < chunks.size(); ++i) EXPECT_LT(chunks[i], chunks[i - 1]);
    }
  }
}

// A decode's cost grows with its context: with a context term, a step under a TPOT
// objective carries (and seats) as many long-context decodes as its time pays for, not the
// count a context-free model would plan.
TEST(SlaScheduler, DecodeCostFollowsItsContext) {
  for (double ctx_s : {0.0, 2e-5}) {
    SCOPED_TRACE(ctx_s);
    SlaSchedulerConfig cfg = small_cfg(512, 64);
    cfg.cost = {.fixed_s = 0.004, .per_prefill_token_s = 0.001, .per_decode_seq_s = 0.001,
                .per_attention_pair_s = 0.0, .per_decode_ctx_s = ctx_s};
    cfg.decode_share = 1.0;
    cfg.tpot_slack = false;  // steps at pace: the cap is what the decodes' contexts cost
    Harness h(4096, 16, cfg);
    // Standard: TPOT 0.2 s, so steps of 160 ms while it decodes; prompts of 1000 tokens.
    for (int i = 0; i < 8; ++i) h.add(SlaClass::kStandard, 1000, 200);
    int most = 0;
    for (int i = 0; i < 2000 && !h.all_finished(); ++i) {
      StepPlan p = h.step();
      int decodes = 0;
      double t = 0.0;
      for (auto& ss : p.seqs) {
        const int pos = ss.seq->n_computed - ss.n_tokens;
        if (ss.n_tokens == 1 && pos >= ss.seq->n_prompt) {
          ++decodes;
          t += cfg.cost.decode_s(pos);
        } else {
          t += cfg.cost.prefill_s(ss.n_tokens, pos);
        }
      }
      most = std::max(most, decodes);
      if (decodes > 1) {
        EXPECT_LE(t, 0.16 - cfg.cost.fixed_s + 1e-9) << "step " << i;
      }
    }
    EXPECT_TRUE(h.all_finished());
    // Context-free, a decode costs 1 ms and all 8 decode together; at ~1000 keys it costs
    // 21-25 ms, and (160 - 4) ms pays for six or seven.
    if (ctx_s == 0.0) {
      EXPECT_EQ(most, 8);
    } else {
      EXPECT_GE(most, 6);
      EXPECT_LE(most, 7);
    }
  }
}

// Under load the fitted step cost can exceed every objective (a fixed cost above the
// target): each step then has room for one decode at the running decodes' mean cost. The
// first work of a step must run even where its own cost is above that mean (a longer
// context, or equal contexts whose mean rounds a hair below each of them); otherwise every
// decode pauses, nothing changes, and no step ever runs again.
TEST(SlaScheduler, EveryStepMakesProgressWhenTheFixedCostExceedsTheObjective) {
  for (int n : {3, 7, 14, 29, 64}) {
    for (int prompt : {23, 39, 61}) {
      SCOPED_TRACE(std::to_string(n) + " sequences of " + std::to_string(prompt) + " tokens");
      SlaSchedulerConfig cfg = small_cfg(256, 64);
      cfg.cost = {.fixed_s = 0.154, .per_prefill_token_s = 0.001, .per_decode_seq_s = 0.001,
                  .per_attention_pair_s = 0.0, .per_decode_ctx_s = 0.00204};
      Harness h(4096, 16, cfg);
      for (int i = 0; i < n; ++i) h.add(SlaClass::kStandard, prompt, 24);
      int steps = 0;
      for (; steps < 20000 && !h.all_finished(); ++steps) {
        const StepPlan p = h.step();
        ASSERT_FALSE(p.seqs.empty()) << "step " << steps << " planned nothing";
      }
      EXPECT_TRUE(h.all_finished());
    }
  }
}

TEST(StepCostModel, MaxPrefillIsTheLongestChunkThatFits) {
  StepCostModel m{.fixed_s = 0.01, .per_prefill_token_s = 0.001, .per_decode_seq_s = 0.001,
                  .per_attention_pair_s = 1e-6, .per_decode_ctx_s = 0.0};
  for (int64_t pos : {0, 1, 100, 2047, 100000}) {
    for (double t : {0.0005, 0.001, 0.05, 0.16, 3.0}) {
      const int n = m.max_prefill(t, pos, 4096);
      if (n > 0) {
        EXPECT_LE(m.prefill_s(n, pos), t) << pos << " " << t;
      }
      if (n < 4096) {
        EXPECT_GT(m.prefill_s(n + 1, pos), t) << pos << " " << t;
      }
    }
  }
  EXPECT_EQ(m.max_prefill(3.0, 0, 64), 64);
  EXPECT_EQ(m.max_prefill(0.0, 0, 64), 0);
  EXPECT_DOUBLE_EQ(StepCostModel::pairs(3, 10), 3 * 10 + 6);
}

// A flood that took every seat of an idle server gives a quiet tenant its share of seats
// as soon as it asks, not when the flood's requests finish; never more, and never back and
// forth.
TEST(SlaScheduler, QuietTenantTakesItsShareOfSeatsFromAFlood) {
  SlaSchedulerConfig cfg = small_cfg(64, 16);
  cfg.max_running_seqs = 4;
  SchedMetrics metrics(cfg.sla);
  cfg.metrics = &metrics;
  Harness h(1024, 16, cfg);
  std::vector<SeqState*> loud;
  for (int i = 0; i < 6; ++i) loud.push_back(h.add(SlaClass::kStandard, 8, 200, "loud"));
  for (int i = 0; i < 3; ++i) h.step();
  int loud_running = 0;
  for (SeqState* q : loud) loud_running += q->status == SeqStatus::kRunning ? 1 : 0;
  ASSERT_EQ(loud_running, 4) << "the flood holds every seat";
  SeqState* q1 = h.add(SlaClass::kStandard, 8, 200, "quiet");
  StepPlan p = h.step();
  EXPECT_TRUE(Harness::has(p, q1)) << "served in the step it arrived";
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0]->tenant, "loud");
  // The victim was the flood's latest admission (least work thrown away).
  uint64_t latest = 0;
  for (SeqState* q : loud) {
    if (q != p.preempted[0] && q->status == SeqStatus::kRunning) latest = std::max(latest, q->admit_order);
  }
  EXPECT_GT(p.preempted[0]->admit_order, latest);
  // Share = 4 seats / 2 tenants: a second quiet request gets a seat, a third waits.
  SeqState* q2 = h.add(SlaClass::kStandard, 8, 200, "quiet");
  SeqState* q3 = h.add(SlaClass::kStandard, 8, 200, "quiet");
  for (int i = 0; i < 40; ++i) h.step();
  EXPECT_EQ(q2->status, SeqStatus::kRunning);
  EXPECT_EQ(q3->status, SeqStatus::kWaiting);
  EXPECT_EQ(metrics.snapshot().classes[1].fair_share_preemptions, 2u) << "no seat changed hands again";
}

TEST(SlaScheduler, OneTenantIsNeverPreemptedForFairShare) {
  SlaSchedulerConfig cfg = small_cfg(64, 16);
  cfg.max_running_seqs = 2;
  SchedMetrics metrics(cfg.sla);
  cfg.metrics = &metrics;
  Harness h(1024, 16, cfg);
  for (int i = 0; i < 5; ++i) h.add(SlaClass::kStandard, 8, 20, "only");
  for (int i = 0; i < 200 && !h.all_finished(); ++i) h.step();
  EXPECT_TRUE(h.all_finished());
  EXPECT_EQ(metrics.snapshot().classes[1].fair_share_preemptions, 0u);
  EXPECT_EQ(metrics.snapshot().classes[1].preemptions, 0u);
}

// The budget is time: a decode and a prompt token cost what the engine measured, not both
// the dearer of the two (which planned 85 ms steps against a 160 ms objective).
TEST(SlaScheduler, StepBudgetChargesDecodesAndPromptTokensTheirOwnCost) {
  SlaSchedulerConfig cfg = small_cfg(512, 64);
  cfg.cost = {.fixed_s = 0.004, .per_prefill_token_s = 0.001, .per_decode_seq_s = 0.003};
  cfg.tpot_cap_own_class = true;  // the prompt is of the decodes' class
  cfg.tpot_slack = false;         // the budget at pace
  Harness h(4096, 16, cfg);
  std::vector<SeqState*> decoding;
  for (int i = 0; i < 10; ++i) decoding.push_back(h.add(SlaClass::kStandard, 8, 100));
  h.step();  // ten 8-token prompts, each samples its first token
  for (SeqState* q : decoding) ASSERT_EQ(q->n_generated(), 1);
  SeqState* prompt = h.add(SlaClass::kStandard, 400, 10);
  StepPlan plan = h.step();
  // Standard decoding: 0.8 x TPOT 0.2 s = 160 ms; minus 4 ms fixed, 10 x 3 ms of decodes
  // leaves 126 ms: 126 prompt tokens at 1 ms.
  int decodes = 0, prompt_tokens = 0;
  for (const auto& ss : plan.seqs) {
    if (ss.seq == prompt) prompt_tokens = ss.n_tokens;
    else decodes += ss.n_tokens;
  }
  EXPECT_EQ(decodes, 10);
  EXPECT_EQ(prompt_tokens, 126);
  EXPECT_EQ(h.s->last_step_budget(), 156);  // prompt tokens one step could take alone
  const double step_s = cfg.cost.step_s(prompt_tokens, decodes);
  EXPECT_LE(step_s, 0.8 * cfg.sla.of(SlaClass::kStandard).tpot_s + 1e-9);
  EXPECT_GE(step_s, 0.8 * cfg.sla.of(SlaClass::kStandard).tpot_s - 0.001) << "the objective's time is used";
}

// Decodes that ran ahead of their TPOT pace (short steps while nothing else waited) yield
// the next step to a prompt, and the step may use the time they banked; no decode's TPOT so
// far (a mean over its tokens) goes past the pace.
// `at_pace`: the decode-only steps before the prompt last exactly the pace (0.8 x TPOT)
// instead of what they cost, so the decoders bank only the margin to tpot_slack_share.
int first_step_prompt_tokens(bool tpot_slack, bool at_pace = false) {
  SlaSchedulerConfig cfg = small_cfg(2048, 64);
  cfg.cost = {.fixed_s = 0.004, .per_prefill_token_s = 0.001, .per_decode_seq_s = 0.003};
  cfg.tpot_slack = tpot_slack;
  cfg.tpot_cap_own_class = true;
  Harness h(4096, 16, cfg);
  const double pace = 0.8 * cfg.sla.of(SlaClass::kStandard).tpot_s;
  std::vector<SeqState*> decoding;
  for (int i = 0; i < 10; ++i) decoding.push_back(h.add(SlaClass::kStandard, 8, 100));
  // Advance the clock by what each step costs; remember when each decoder's tokens came.
  std::map<const SeqState*, std::vector<double>> token_times;
  auto timed_step = [&] {
    const double start = static_cast<double>(h.now_ns) / 1e9;
    std::vector<int> before;
    for (const SeqState* q : decoding) before.push_back(q->n_generated());
    StepPlan plan = h.step();
    int prompt_tokens = 0, decodes = 0;
    for (const auto& ss : plan.seqs) {
      const bool decode = ss.n_tokens == 1 && ss.seq->n_prompt < ss.seq->n_computed;
      (decode ? decodes : prompt_tokens) += ss.n_tokens;
    }
    const double end = start + cfg.cost.step_s(prompt_tokens, decodes);
    h.now_ns = static_cast<int64_t>(end * 1e9);
    for (size_t i = 0; i < decoding.size(); ++i) {
      if (decoding[i]->n_generated() > before[i]) token_times[decoding[i]].push_back(end);
    }
    return plan;
  };
  timed_step();  // ten 8-token prompts sample their first tokens
  for (int i = 0; i < 6; ++i) {
    timed_step();  // decode-only steps of 34 ms: ahead of a 160 ms pace
    if (at_pace) {
      h.now_ns += static_cast<int64_t>((pace - cfg.cost.step_s(0, 10)) * 1e9);
      for (const SeqState* q : decoding) token_times[q].back() = static_cast<double>(h.now_ns) / 1e9;
    }
  }
  SeqState* prompt = h.add(SlaClass::kStandard, 1000, 4);
  StepPlan plan = timed_step();
  int prompt_tokens = 0;
  for (const auto& ss : plan.seqs) prompt_tokens += ss.seq == prompt ? ss.n_tokens : 0;
  for (int guard = 0; guard < 200 && prompt->n_generated() < 1; ++guard) timed_step();
  EXPECT_GE(prompt->n_generated(), 1);
  for (int i = 0; i < 20; ++i) timed_step();
  for (const auto& [q, times] : token_times) {
    for (size_t k = 1; k < times.size(); ++k) {
      EXPECT_LE((times[k] - times[0]) / static_cast<double>(k),
                (tpot_slack ? cfg.tpot_slack_share / 0.8 : 1.0) * pace + 1e-9)
          << "token " << k;
    }
  }
  return prompt_tokens;
}

TEST(SlaScheduler, DecodesAheadOfTheirPaceLendTheStepToAPrompt) {
  const int with_slack = first_step_prompt_tokens(true);
  const int without = first_step_prompt_tokens(false);
  // On pace: 160 ms - 4 ms fixed - 10 x 3 ms of decodes = 126 prompt tokens.
  EXPECT_EQ(without, 126);
  // Six 34-ms steps banked ~0.75 s per decoder; the step is capped at a quarter of the TTFT
  // objective (0.5 s) and leaves every decoder a pace for the step after it.
  EXPECT_GT(with_slack, 300);
  // Steps exactly at pace: each token banked 0.9 x 0.2 - 0.16 = 20 ms; seven tokens (the
  // first and six at pace) leave 0.18 x 7 - 0.96 = 300 ms for the step: 300 - 4 - 30 = 266
  // prompt tokens. Banking against the pace itself would leave only the pace (126).
  EXPECT_NEAR(first_step_prompt_tokens(true, /*at_pace=*/true), 266, 2);
  EXPECT_EQ(first_step_prompt_tokens(false, /*at_pace=*/true), 126);
}

// --tpot-cap lower: a class's decodes cap the step only while a lower class has prompts;
// their own class's prompts get a step as long as the TTFT bound allows. --tpot-cap all
// (the default) caps it against both.
TEST(SlaScheduler, TpotCapsTheStepAgainstLowerClassesOnly) {
  for (const bool own : {false, true}) {
    SlaSchedulerConfig cfg = small_cfg(512, 64);
    cfg.cost = {.fixed_s = 0.004, .per_prefill_token_s = 0.001, .per_decode_seq_s = 0.003};
    cfg.tpot_cap_own_class = own;
    cfg.realtime_prefill_exclusive = false;
    cfg.tpot_slack = false;  // the budget at pace
    Harness h(4096, 16, cfg);
    for (int i = 0; i < 10; ++i) h.add(SlaClass::kStandard, 8, 100);
    h.step();
    SeqState* same = h.add(SlaClass::kStandard, 1000, 10);
    StepPlan plan = h.step();
    int tokens = 0;
    for (const auto& ss : plan.seqs) tokens += ss.seq == same ? ss.n_tokens : 0;
    // Capped: 160 ms - 4 ms - 10 x 3 ms = 126 prompt tokens. Uncapped, a quarter of the
    // class's TTFT objective still bounds the step: 500 ms - 4 ms - 30 ms = 466.
    if (own) {
      EXPECT_EQ(tokens, 126);
    } else {
      EXPECT_NEAR(tokens, 466, 1);
    }
    // A batch prompt below them: their TPOT caps the step in both modes.
    SeqState* lower = h.add(SlaClass::kBatch, 1000, 10);
    plan = h.step();
    int lower_tokens = 0, other = 0;
    for (const auto& ss : plan.seqs) (ss.seq == lower ? lower_tokens : other) += ss.n_tokens;
    EXPECT_LE(cfg.cost.step_s(lower_tokens + other - 10, 10), 0.8 * cfg.sla.of(SlaClass::kStandard).tpot_s + 1e-9)
        << "own-class cap " << own;
  }
}

TEST(SlaScheduler, TinyKvFloodAlwaysFinishes) {
  // 8 blocks of 4 tokens (32 slots); floods of requests that each fit alone, of every class
  // and two tenants, arriving while others run. Nothing may deadlock, livelock or leak.
  uint64_t total_preemptions = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    SlaSchedulerConfig cfg = small_cfg(16, 4);
    cfg.sla.of(SlaClass::kBatch).starve_s = 0.5;
    cfg.sla.of(SlaClass::kStandard).starve_s = 0.3;
    Harness h(8, 4, cfg);
    uint64_t x = seed;
    int added = 0, steps = 0;
    for (; steps < 20000 && (added < 60 || !h.all_finished()); ++steps) {
      if (added < 60 && steps % 3 == 0) {
        x = mix64(x);
        const SlaClass cls = static_cast<SlaClass>(x % 3);
        const int prompt = 1 + static_cast<int>((x >> 8) % 20);
        const int max_new = 1 + static_cast<int>((x >> 16) % (32 - prompt));
        h.add(cls, prompt, max_new, (x >> 24) % 2 ? "a" : "b");
        ++added;
      }
      h.step();
    }
    ASSERT_TRUE(h.all_finished()) << "seed " << seed;
    // 60 requests of at most 32 tokens, 16 tokens a step: a few hundred steps of work.
    EXPECT_LT(steps, 2000) << "seed " << seed << ": progress too slow (thrashing?)";
    for (auto& q : h.seqs) EXPECT_EQ(q->n_generated(), q->max_new_tokens);
    EXPECT_EQ(h.kv.stats().blocks_used, 0);
    total_preemptions += h.s->counts().preemptions;
  }
  EXPECT_GT(total_preemptions, 0u) << "the floods should have needed preemption";
}

TEST(SlaScheduler, LargestRequestThatFitsAloneFinishesUnderAFlood) {
  // A batch request needing the whole cache (32 slots) against a stream of small realtime
  // requests that never stops while it runs: the starvation lane must get it through.
  SlaSchedulerConfig cfg = small_cfg(8, 4);
  cfg.sla.of(SlaClass::kBatch).starve_s = 0.2;
  Harness h(8, 4, cfg);
  SeqState* big = h.add(SlaClass::kBatch, 20, 12);
  for (int guard = 0; guard < 5000 && big->status != SeqStatus::kFinished; ++guard) {
    h.add(SlaClass::kRealtime, 3, 2);
    h.step();
  }
  EXPECT_EQ(big->status, SeqStatus::kFinished);
  EXPECT_EQ(big->n_generated(), 12);
}

TEST(SlaScheduler, LargeRequestFinishesUnderAFloodOfItsOwnClass) {
  // One class, one tenant: a request needing the whole cache among a stream of small ones
  // that shortest-first would always prefer. Once it has starved, nothing is admitted behind
  // it until it fits.
  SlaSchedulerConfig cfg = small_cfg(8, 4);
  cfg.sla.of(SlaClass::kStandard).starve_s = 0.05;
  Harness h(8, 4, cfg);
  h.add(SlaClass::kStandard, 3, 4);
  SeqState* big = h.add(SlaClass::kStandard, 24, 8);
  for (int guard = 0; guard < 5000 && big->status != SeqStatus::kFinished; ++guard) {
    h.add(SlaClass::kStandard, 3, 4);
    h.step();
  }
  EXPECT_EQ(big->status, SeqStatus::kFinished);
  EXPECT_EQ(big->n_generated(), 8);
}

TEST(SlaScheduler, RequestLargerThanTheCacheDoesNotPreemptForNothing) {
  // 32 slots; a realtime prompt of 40 tokens can never fit. It must not evict the batch
  // sequences that hold the cache (the engine refuses such requests before they get here).
  Harness h(8, 4, small_cfg(64, 8));
  SeqState* b1 = h.add(SlaClass::kBatch, 8, 4);  // 11 slots: 3 blocks each, both fit
  SeqState* b2 = h.add(SlaClass::kBatch, 8, 4);
  h.step();
  SeqState* huge = h.add(SlaClass::kRealtime, 40, 1);
  for (int i = 0; i < 20; ++i) {
    StepPlan p = h.step();
    EXPECT_TRUE(p.preempted.empty());
  }
  EXPECT_EQ(huge->status, SeqStatus::kWaiting);
  EXPECT_EQ(b1->status, SeqStatus::kFinished);
  EXPECT_EQ(b2->status, SeqStatus::kFinished);
  EXPECT_EQ(h.s->counts().preemptions, 0u);
}

TEST(SlaScheduler, FactoryAndValidation) {
  kv::KvCacheManager kv({.n_blocks = 16, .block_size = 16});
  SchedulerOptions opts;
  auto f = make_scheduler("fcfs", opts, kv);
  ASSERT_TRUE(f.ok());
  EXPECT_STREQ((*f)->name(), "fcfs");
  EXPECT_FALSE((*f)->queue_order()->by_class());
  auto s = make_scheduler("sla", opts, kv);
  ASSERT_TRUE(s.ok());
  EXPECT_STREQ((*s)->name(), "sla");
  EXPECT_TRUE((*s)->queue_order()->by_class());
  auto bad = make_scheduler("lifo", opts, kv);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'lifo'"), std::string::npos);
  // Each policy takes its own options and names what it does not know.
  opts.policy = {{"tpot_slack", "off"}, {"decode_share", "0.5"}, {"tpot_cap", "lower"}};
  EXPECT_TRUE(make_scheduler("sla", opts, kv).ok());
  EXPECT_TRUE(check_scheduler_options("sla", opts).ok());
  Status fcfs_opt = check_scheduler_options("fcfs", opts);
  ASSERT_FALSE(fcfs_opt.ok());
  EXPECT_NE(fcfs_opt.message().find("tpot_slack"), std::string::npos);
  opts.policy = {{"decode_share", "2"}};
  EXPECT_FALSE(check_scheduler_options("sla", opts).ok());  // out of range
  opts.policy = {{"tpot_slack", "maybe"}};
  Status bad_value = check_scheduler_options("sla", opts);
  ASSERT_FALSE(bad_value.ok());
  EXPECT_NE(bad_value.message().find("tpot_slack"), std::string::npos);
  opts.policy = {{"no_such_knob", "1"}};
  Status unknown = check_scheduler_options("sla", opts);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.message().find("no_such_knob"), std::string::npos);
  SlaSchedulerConfig cfg;
  cfg.levels = 0;
  EXPECT_FALSE(validate(cfg).ok());
  cfg.levels = 4;
  cfg.sla.of(SlaClass::kRealtime).tpot_s = -1.0;
  Status st = validate(cfg);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("realtime"), std::string::npos);
}

}  // namespace
}  // namespace metro::sched
