#include <algorithm>
#include <cmath>
#include <deque>

#include "base/check.h"
#include "sched/scheduler.h"

namespace metro::sched {

namespace {

class FcfsScheduler final : public Scheduler {
 public:
  FcfsScheduler(const SchedulerConfig& cfg, kv::KvCacheManager& kv) : cfg_(cfg), kv_(kv) {}

  void add(SeqState* seq) override {
    seq->status = SeqStatus::kWaiting;
    waiting_.push_back(seq);
  }

  void add_running(SeqState* seq) override {
    seq->status = SeqStatus::kRunning;
    seq->admit_order = ++admit_counter_;
    running_.push_back(seq);
  }

  StepPlan schedule(int64_t now_ns) override {
    StepPlan plan;
    const int budget_total = step_tokens();
    int budget = budget_total;
    int logits = 0;

    // 1. Running sequences, oldest admission first: their next token or prefill chunk.
    for (size_t i = 0; i < running_.size() && budget > 0;) {
      SeqState* s = running_[i];
      int n = std::min(s->n_to_compute(), budget);
      if (n <= 0 || s->cuts_whole_prompt(n) || static_cast<int>(plan.seqs.size()) >= cfg_.max_seqs) {
        ++i;
        continue;
      }
      // Drafts beyond the logit cap are left out; the committed token still needs a row.
      while (n > s->n_uncomputed() && logits + plan_entry(s, n).logit_rows() > cfg_.max_logits) --n;
      const ScheduledSeq entry = plan_entry(s, n);
      if (logits + entry.logit_rows() > cfg_.max_logits) {
        ++i;
        continue;
      }
      if (!allocate_or_preempt(s, n, &plan)) {
        // s itself was the newest running sequence and got preempted; running_ shrank.
        continue;
      }
      plan.seqs.push_back(entry);
      budget -= n;
      logits += entry.logit_rows();
      ++i;
    }

    // 2. Waiting sequences in arrival order (preempted ones went back to the front).
    while (!waiting_.empty() && budget > 0 && static_cast<int>(plan.seqs.size()) < cfg_.max_seqs &&
           static_cast<int>(running_.size()) < cfg_.max_seqs) {
      SeqState* s = waiting_.front();
      if (!kv_.has(s->id)) {
        const std::span<const int32_t> lookup = s->use_prefix_cache ? std::span<const int32_t>(s->tokens)
                                                                 : std::span<const int32_t>();
        const int cached = kv_.computed_blocks(s->id, lookup, s->cache_scope);
        s->n_computed = cached;
        if (s->n_preemptions == 0) s->n_cached_prompt = std::min(cached, s->n_prompt);
      }
      const int n = std::min(s->n_uncomputed(), budget);
      if (s->cuts_whole_prompt(n)) {  // waits for a step with room for all of it
        kv_.free(s->id);
        s->n_computed = 0;
        break;
      }
      const ScheduledSeq entry = plan_entry(s, n);
      if (logits + entry.logit_rows() > cfg_.max_logits) break;
      if (!reserve_for(kv_, *s, n)) {
        // No room: give back prefix hits so cached blocks stay evictable, retry later.
        kv_.free(s->id);
        s->n_computed = 0;
        break;
      }
      waiting_.pop_front();
      s->status = SeqStatus::kRunning;
      s->admit_order = ++admit_counter_;
      if (s->first_scheduled_ns == 0) s->first_scheduled_ns = now_ns;
      running_.push_back(s);
      plan.seqs.push_back(entry);
      budget -= n;
      logits += entry.logit_rows();
    }
    plan.n_tokens = budget_total - budget;
    return plan;
  }

  using Scheduler::update;
  void update(const StepPlan& plan, const StepResult& result) override {
    for (size_t i = 0; i < plan.seqs.size(); ++i) {
      advance_computed(kv_, plan.seqs[i], i < result.n_accepted.size() ? result.n_accepted[i] : 0);
    }
  }

  void remove(SeqState* seq) override {
    kv_.free(seq->id);
    auto r = std::find(running_.begin(), running_.end(), seq);
    if (r != running_.end()) running_.erase(r);
    auto w = std::find(waiting_.begin(), waiting_.end(), seq);
    if (w != waiting_.end()) waiting_.erase(w);
    seq->status = SeqStatus::kFinished;
  }

  SchedulerCounts counts() const override {
    return {static_cast<int>(waiting_.size()), static_cast<int>(running_.size()), preemptions_};
  }

  // FCFS plans by tokens alone; it fits the step cost anyway so that every policy reports
  // what a step costs.
  void observe_step(const StepCostSample& sample) override { cost_.observe(sample); }
  void set_step_scale(double scale) override {
    METRO_CHECK(scale > 0.0);
    scale_ = scale;
  }
  SchedulerStats stats() const override { return {counts(), step_tokens(), cost_.model()}; }
  std::shared_ptr<const QueueOrder> queue_order() const override { return fifo_queue_order(); }

  const char* name() const override { return "fcfs"; }

 private:
  // FCFS sizes steps by tokens: the budget is max_batch_tokens scaled down (never up).
  int step_tokens() const {
    return std::max(1, static_cast<int>(std::floor(cfg_.max_batch_tokens * std::min(1.0, scale_))));
  }

  // Allocates n slots for running sequence s, preempting the most recently admitted running
  // sequences until it fits. Returns false if s itself had to be preempted.
  bool allocate_or_preempt(SeqState* s, int n, StepPlan* plan) {
    while (!reserve_for(kv_, *s, n)) {
      SeqState* victim = *std::max_element(running_.begin(), running_.end(),
                                           [](const SeqState* a, const SeqState* b) {
                                             return a->admit_order < b->admit_order;
                                           });
      preempt(victim, plan);
      if (victim == s) return false;
    }
    return true;
  }

  void preempt(SeqState* victim, StepPlan* plan) {
    // A victim scheduled earlier in this step is dropped from the plan.
    auto p = std::find_if(plan->seqs.begin(), plan->seqs.end(),
                          [&](const ScheduledSeq& ss) { return ss.seq == victim; });
    METRO_CHECK(p == plan->seqs.end());  // victims are newer than anything already planned
    kv_.free(victim->id);
    victim->n_computed = 0;
    victim->status = SeqStatus::kWaiting;
    ++victim->n_preemptions;
    ++preemptions_;
    running_.erase(std::find(running_.begin(), running_.end(), victim));
    waiting_.push_front(victim);
    plan->preempted.push_back(victim);
  }

  SchedulerConfig cfg_;
  kv::KvCacheManager& kv_;
  std::vector<SeqState*> running_;   // in admission order
  std::deque<SeqState*> waiting_;    // in arrival order, preempted first
  uint64_t admit_counter_ = 0;
  uint64_t preemptions_ = 0;
  StepCostTracker cost_;
  double scale_ = 1.0;
};

}  // namespace

std::unique_ptr<Scheduler> make_fcfs_scheduler(const SchedulerConfig& cfg, kv::KvCacheManager& kv) {
  return std::make_unique<FcfsScheduler>(cfg, kv);
}

}  // namespace metro::sched
