// Who runs in the next step. Policies (FCFS; the SLA-class multilevel feedback queue) plug
// in behind Scheduler; the engine does not know which one runs.
//
// Each step the scheduler builds a StepPlan under a token budget and a sequence cap:
// decode tokens of running sequences first, then chunks of waiting prompts (chunked
// prefill). It reaches KV memory only through kv::KvCacheManager's computed_blocks /
// allocate / free; when blocks run out it preempts a running sequence (frees its blocks;
// it is recomputed later from its tokens).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "sched/seq_state.h"

namespace metro::sched {

struct SchedulerConfig {
  int max_batch_tokens = 256;  // tokens computed per step (decode + prefill chunks)
  int max_seqs = 64;           // sequences per step
  int max_logits = 64;         // tokens per step that need logits (<= max_seqs)
};

struct ScheduledSeq {
  SeqState* seq = nullptr;
  int n_tokens = 0;  // compute tokens [seq->n_computed, seq->n_computed + n_tokens)
  // True when this chunk reaches the sequence's last token: its logits are sampled.
  bool samples() const { return seq->n_computed + n_tokens == static_cast<int>(seq->tokens.size()); }
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;
  std::vector<SeqState*> preempted;  // lost their blocks this step; will be recomputed
  int n_tokens = 0;
  bool empty() const { return seqs.empty(); }
};

struct SchedulerCounts {
  int waiting = 0;
  int running = 0;
  uint64_t preemptions = 0;
  // Per SLA class (index = SlaClass); policies that do not track classes leave them zero.
  std::array<int, kNumSlaClasses> waiting_by_class{};
  std::array<int, kNumSlaClasses> running_by_class{};
};

class Scheduler {
 public:
  virtual ~Scheduler() = default;

  // A new sequence (status waiting, no blocks).
  virtual void add(SeqState* seq) = 0;
  // A sequence that already holds KV for its first n_computed tokens (a fork of a sibling).
  virtual void add_running(SeqState* seq) = 0;
  virtual StepPlan schedule(int64_t now_ns) = 0;
  // After the step ran: advances computed counts and publishes full blocks to the cache.
  virtual void update(const StepPlan& plan) = 0;
  // Finished or aborted: forgets the sequence and frees its blocks.
  virtual void remove(SeqState* seq) = 0;
  // Finished normally (a stop condition or max_tokens; not an abort or an error): like
  // remove(), and a policy that predicts output lengths learns from seq->n_generated().
  virtual void finish(SeqState* seq) { remove(seq); }
  virtual SchedulerCounts counts() const = 0;
  virtual const char* name() const = 0;
};

// First come, first served: running sequences in admission order, then waiting ones in
// arrival order; preemption takes the most recently admitted running sequence.
std::unique_ptr<Scheduler> make_fcfs_scheduler(const SchedulerConfig& cfg, kv::KvCacheManager& kv);

}  // namespace metro::sched
