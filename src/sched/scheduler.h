// Who runs in the next step. Policies (FCFS; the SLA-class multilevel feedback queue) plug
// in behind Scheduler; the engine does not know which one runs, and each policy takes its
// own options through make_scheduler().
//
// Each step the scheduler builds a StepPlan under a token budget and a sequence cap. It
// thinks in computed versus total tokens per sequence, not in phases: a sequence asks for
// its uncomputed tokens (a prompt chunk, or the one token sampled last) and, when only that
// token is left, for the draft tokens proposed after it (SeqState::draft). Drafts are just
// more tokens to compute; update() learns how many of them were accepted. It reaches KV
// memory only through kv::KvCacheManager's computed_blocks / allocate / truncate / free;
// when blocks run out it preempts a running sequence (frees its blocks; it is recomputed
// later from its tokens).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/sla.h"
#include "base/status.h"
#include "kv/kv_cache_manager.h"
#include "sched/queue_order.h"
#include "sched/seq_state.h"
#include "sched/step_cost_fit.h"

namespace metro::sched {

class SchedMetrics;

struct SchedulerConfig {
  int max_batch_tokens = 256;  // tokens computed per step (prompt chunks, decodes, drafts)
  int max_seqs = 64;           // sequences per step
  int max_logits = 64;         // tokens per step that need logits (a verified draft needs one)
};

struct ScheduledSeq {
  SeqState* seq = nullptr;
  // Compute tokens [seq->n_computed, seq->n_computed + n_tokens): committed tokens first,
  // then the last n_draft of them are drafts (seq->draft[0 .. n_draft)).
  int n_tokens = 0;
  int n_draft = 0;
  // The chunk reaches the last committed token: its logits are sampled, and so are each
  // draft's (1 + n_draft rows).
  bool sample = false;

  bool samples() const { return sample; }
  int logit_rows() const { return sample ? 1 + n_draft : 0; }
};

// The plan entry for computing n tokens of s (n <= s->n_to_compute()).
ScheduledSeq plan_entry(SeqState* s, int n);

struct StepPlan {
  std::vector<ScheduledSeq> seqs;
  std::vector<SeqState*> preempted;  // lost their blocks this step; will be recomputed
  int n_tokens = 0;
  bool empty() const { return seqs.empty(); }
};

// What the step's sampling decided, for update(): drafts accepted per entry of the plan.
// Empty: no drafts were accepted. The engine moves accepted drafts into seq->tokens (and
// clears seq->draft) before calling update().
struct StepResult {
  std::vector<int> n_accepted;  // [plan.seqs.size()], each <= that entry's n_draft
};

struct SchedulerCounts {
  int waiting = 0;
  int running = 0;
  uint64_t preemptions = 0;
  // Per SLA class (index = SlaClass); policies that do not track classes leave them zero.
  std::array<int, kNumSlaClasses> waiting_by_class{};
  std::array<int, kNumSlaClasses> running_by_class{};
};

// A policy's state for metrics and stats.
struct SchedulerStats {
  SchedulerCounts counts;
  int step_budget_tokens = 0;  // the token budget the last schedule() used
  StepCostModel step_cost;     // fitted from observe_step(); all zero until known
};

class Scheduler {
 public:
  virtual ~Scheduler() = default;

  // A new sequence (status waiting, no blocks).
  virtual void add(SeqState* seq) = 0;
  // A sequence that already holds KV for its first n_computed tokens (a fork of a sibling).
  virtual void add_running(SeqState* seq) = 0;
  virtual StepPlan schedule(int64_t now_ns) = 0;
  // After the step ran and was sampled: advances computed counts by the committed tokens
  // and accepted drafts, gives back the KV slots of rejected drafts, and publishes full
  // blocks of committed tokens to the prefix cache.
  virtual void update(const StepPlan& plan, const StepResult& result) = 0;
  void update(const StepPlan& plan) { update(plan, StepResult{}); }
  // Finished or aborted: forgets the sequence and frees its blocks.
  virtual void remove(SeqState* seq) = 0;
  // Finished normally (a stop condition or max_tokens; not an abort or an error): like
  // remove(), and a policy that predicts output lengths learns from seq->n_generated().
  virtual void finish(SeqState* seq) { remove(seq); }
  // What each step cost (after it ran). Policies that size steps by time learn from it.
  virtual void observe_step(const StepCostSample& sample) = 0;
  // The batch budget the adaptive controller sets by load (engine/adaptive/tier_controller.h):
  // a factor on the length of the coming steps, 1 until set. It scales the time target of a
  // policy that sizes steps by time; the token budget follows it but never exceeds
  // max_batch_tokens (the engine's buffers are sized for that). Must be > 0.
  virtual void set_step_scale(double scale) = 0;
  virtual SchedulerCounts counts() const = 0;
  virtual SchedulerStats stats() const = 0;
  // How this policy orders waiting prompts, for admission control's TTFT prediction.
  virtual std::shared_ptr<const QueueOrder> queue_order() const = 0;
  virtual const char* name() const = 0;
  // The policy's state in a few lines of text, for the engine's report when steps stop
  // making progress; empty where a policy says nothing.
  virtual std::string describe() const { return {}; }
};

// What every policy is built from. `policy` holds the named policy's own options as
// key=value pairs (metro serve's --sched-opt and the flags that map onto it); a key the
// policy does not know is an error naming it.
struct SchedulerOptions {
  SchedulerConfig base;
  SlaConfig objectives;  // per-class objectives (SLA-aware policies plan by them)
  std::vector<std::pair<std::string, std::string>> policy;
  SchedMetrics* metrics = nullptr;  // preemptions and predictor accuracy, when set
};

// The policy metro serve runs unless told otherwise.
inline constexpr const char* kDefaultPolicy = "sla";

// `--sched fcfs|sla`. Errors: an unknown policy, an unknown or malformed option.
Expected<std::unique_ptr<Scheduler>> make_scheduler(std::string_view name, const SchedulerOptions& options,
                                                    kv::KvCacheManager& kv);
// make_scheduler()'s checks alone, without a KV cache (to refuse bad flags at start-up).
Status check_scheduler_options(std::string_view name, const SchedulerOptions& options);
// The names make_scheduler() takes.
const std::vector<std::string>& scheduler_names();

// First come, first served: running sequences in admission order, then waiting ones in
// arrival order; preemption takes the most recently admitted running sequence.
std::unique_ptr<Scheduler> make_fcfs_scheduler(const SchedulerConfig& cfg, kv::KvCacheManager& kv);

// Shared by the policies: after the step, advance `e`'s sequence by what was committed
// (accepted drafts included), give back the slots of rejected drafts, publish full blocks.
void advance_computed(kv::KvCacheManager& kv, const ScheduledSeq& e, int n_accepted);
// Blocks KV must supply for planning n tokens of s (drafts as lookahead).
int32_t blocks_for(const kv::KvCacheManager& kv, const SeqState& s, int n);
// Reserves KV for planning n tokens of s (drafts as lookahead); all or nothing.
bool reserve_for(kv::KvCacheManager& kv, const SeqState& s, int n);

}  // namespace metro::sched
