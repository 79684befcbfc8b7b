#include <gtest/gtest.h>

#include <memory>
#include <numeric>

#include "sched/scheduler.h"

namespace metro::sched {
namespace {

struct Sim {
  kv::KvCacheManager kv;
  std::unique_ptr<Scheduler> s;
  std::vector<std::unique_ptr<SeqState>> seqs;
  int steps = 0;

  Sim(int n_blocks, int block_size, SchedulerConfig cfg, bool prefix = true)
      : kv({.n_blocks = n_blocks, .block_size = block_size, .prefix_cache = prefix}),
        s(make_fcfs_scheduler(cfg, kv)) {}

  SeqState* add(int n_prompt, int max_new, int32_t first_token = 1000) {
    auto q = std::make_unique<SeqState>();
    q->id = seqs.size() + 1;
    q->tokens.resize(static_cast<size_t>(n_prompt));
    std::iota(q->tokens.begin(), q->tokens.end(), first_token);
    q->n_prompt = n_prompt;
    q->max_new_tokens = max_new;
    s->add(q.get());
    seqs.push_back(std::move(q));
    return seqs.back().get();
  }

  // One step: plan, "compute", sample a fake token for sequences whose chunk reached the end.
  StepPlan step() {
    StepPlan plan = s->schedule(++steps);
    std::vector<bool> samples;
    for (auto& ss : plan.seqs) samples.push_back(ss.samples());
    s->update(plan);
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      SeqState* q = plan.seqs[i].seq;
      if (!samples[i]) continue;
      q->tokens.push_back(static_cast<int32_t>(q->id * 7 + q->tokens.size()));
      if (q->n_generated() >= q->max_new_tokens) s->remove(q);
    }
    return plan;
  }

  bool all_finished() const {
    for (auto& q : seqs) {
      if (q->status != SeqStatus::kFinished) return false;
    }
    return true;
  }
};

TEST(FcfsScheduler, DecodeFirstThenPrefillChunksInArrivalOrder) {
  Sim sim(64, 16, {.max_batch_tokens = 32, .max_seqs = 8, .max_logits = 8});
  SeqState* a = sim.add(10, 5);
  auto p1 = sim.step();
  ASSERT_EQ(p1.seqs.size(), 1u);
  EXPECT_EQ(p1.seqs[0].n_tokens, 10);
  SeqState* b = sim.add(100, 5);
  SeqState* c = sim.add(5, 5);
  auto p2 = sim.step();
  ASSERT_EQ(p2.seqs.size(), 2u);
  EXPECT_EQ(p2.seqs[0].seq, a);  // decode token first
  EXPECT_EQ(p2.seqs[0].n_tokens, 1);
  EXPECT_EQ(p2.seqs[1].seq, b);  // then b's first chunk takes the rest of the budget
  EXPECT_EQ(p2.seqs[1].n_tokens, 31);
  EXPECT_FALSE(p2.seqs[1].samples());
  auto p3 = sim.step();  // a decodes, b continues (31 more), c waits
  EXPECT_EQ(p3.seqs[1].seq, b);
  EXPECT_EQ(p3.seqs[1].n_tokens, 31);
  EXPECT_EQ(c->status, SeqStatus::kWaiting);
  while (!sim.all_finished()) sim.step();
  EXPECT_EQ(sim.kv.stats().blocks_used, 0);
}

TEST(FcfsScheduler, StepScaleCutsTheTokenBudgetNeverRaisesIt) {
  Sim sim(64, 16, {.max_batch_tokens = 32, .max_seqs = 8, .max_logits = 8});
  sim.add(100, 2);
  sim.s->set_step_scale(0.5);
  EXPECT_EQ(sim.step().n_tokens, 16);
  EXPECT_EQ(sim.s->stats().step_budget_tokens, 16);
  sim.s->set_step_scale(4.0);
  EXPECT_EQ(sim.step().n_tokens, 32);
  EXPECT_EQ(sim.s->stats().step_budget_tokens, 32);
}

TEST(FcfsScheduler, SequenceCapAndLogitCap) {
  Sim sim(64, 16, {.max_batch_tokens = 512, .max_seqs = 3, .max_logits = 3});
  for (int i = 0; i < 6; ++i) sim.add(4, 3, 100 * i);
  auto p = sim.step();
  EXPECT_EQ(p.seqs.size(), 3u);
  while (!sim.all_finished()) {
    auto q = sim.step();
    EXPECT_LE(q.seqs.size(), 3u);
  }
}

TEST(FcfsScheduler, PreemptsNewestAndEveryoneFinishes) {
  // 8 blocks of 4 tokens = 32 slots; 5 sequences that each grow to 4 + 8 = 12 tokens.
  Sim sim(8, 4, {.max_batch_tokens = 64, .max_seqs = 8, .max_logits = 8});
  for (int i = 0; i < 5; ++i) sim.add(4, 8, 1000 * (i + 1));
  uint64_t preempted = 0;
  for (int guard = 0; guard < 1000 && !sim.all_finished(); ++guard) {
    auto p = sim.step();
    for (SeqState* v : p.preempted) {
      // A victim loses its blocks and is not computed in the step that preempted it.
      for (auto& ss : p.seqs) EXPECT_NE(ss.seq, v);
      EXPECT_EQ(v->n_computed, 0);
      EXPECT_EQ(sim.kv.n_slots(v->id), 0);
      ++preempted;
    }
  }
  EXPECT_TRUE(sim.all_finished());
  EXPECT_GT(preempted, 0u);
  EXPECT_EQ(sim.s->counts().preemptions, preempted);
  for (auto& q : sim.seqs) EXPECT_EQ(q->n_generated(), 8);
  EXPECT_EQ(sim.kv.stats().blocks_used, 0);
}

TEST(FcfsScheduler, PrefixHitsSkipComputation) {
  Sim sim(64, 16, {.max_batch_tokens = 512, .max_seqs = 8, .max_logits = 8});
  sim.add(100, 1, 5);
  while (!sim.all_finished()) sim.step();
  SeqState* b = sim.add(100, 1, 5);  // the same prompt
  auto p = sim.step();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(b->n_cached_prompt, 96);
  EXPECT_EQ(p.seqs[0].n_tokens, 4);
}

}  // namespace
}  // namespace metro::sched
