// The SLA-class policy: a multilevel feedback queue over classes, with aging, predicted
// shortest-remaining-work first, tenant fair share and class preemption. docs/scheduling.md
// explains it at length and quotes the simulator's figures.
//
// Every step each sequence (running or waiting) gets a priority key, smallest first:
//
//   tier    0 for urgent work, ordered among itself by arrival: a decode paused for its
//           class's `starve` time, and the starvation lane (below); 1 for everything else
//   rank    the class (realtime 0, standard 1, batch 2) minus aging. A class's prompts
//           climb together, by the wait of its longest-waiting prompt: one class per
//           starve/(class+1) seconds. A paused decode climbs on its own, one class per TPOT
//           objective it waited, never above its class's prompts
//   class   the native class (an aged class yields ties to a native one)
//   phase   decodes of running sequences before prefill chunks (pausing a decode for a
//           prompt of its own class would hold its KV idle and break its TPOT), except a
//           decode two TPOT paces ahead of its objective, which goes after them (with
//           tpot_slack and a step cost model)
//   level   skip-join MLFQ level: work done so far (prompt tokens x prefill_token_cost +
//           generated tokens) against the class quantum, doubling per level; long prompts
//           join lower, long generations drop
//   share   prompts only: the tenant's virtual token counter (fair share in the class)
//   work    predicted remaining work: uncomputed tokens x prefill_token_cost + the
//           LengthPredictor's expected remaining output
//   arrival, id
//
// The plan takes work in key order until the token budget, the sequence cap or the logit
// cap is spent; what does not fit is paused (not scheduled; its blocks kept). A step that
// prefills a realtime prompt carries nothing of lower classes. A waiting request is
// admitted only into a free seat (running sequences of its class and above, capped at
// max_running_seqs and at decode_share of the step budget) and only when KV for its whole
// prompt is free, leaving kv_watermark of the blocks for running decodes and realtime.
//
// Seats are shared between tenants too: while a class's seats are all taken, a tenant with
// a waiting prompt and fewer than seats / active tenants of them takes one from the tenant
// holding the most above that share (its latest admission is preempted).
//
// When blocks run out, the sequence being planned preempts (frees, to be recomputed) a
// running one, the lowest priority first, in a stable order so two sequences can never
// take turns forever: a running sequence may take the blocks of any running sequence of a
// lower class or of its class admitted after it (so the oldest admission of the best
// class always progresses: no deadlock); a waiting one only a lower class's (a realtime
// arrival preempts batch, never a neighbour of its class); the lane anyone's but an older
// lane's.
//
// Starvation. The lane: the oldest request whose prompt has waited its class's `starve`
// while a higher class had work and its class got no prompt served for `starve` goes first
// (tier 0, at most starving_prefill_share of each step) until its prompt is done. A class
// starved by its own backlog instead moves each tenant's oldest waiting request (past
// in_class_starve_factor x starve) to the front of that tenant's requests.
//
// With a step cost model, the token budget is also cut so one step fits the tightest
// objective of the classes present: step_per_tpot x TPOT of classes with running decodes
// (with tpot_cap_own_class off, only while a lower class has prompt work),
// step_per_ttft x TTFT of classes with work or a recent arrival (a realtime request should
// not arrive behind a 600 ms step). With tpot_slack (TPOT is a mean over the request), a
// decode that ran ahead of that pace (short steps while nothing waited) allows a longer
// step, and one two paces ahead sits the step out if prompts fill it; the step then ends
// early enough that the decode is back on pace in the next one.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"
#include "sched/fair_share.h"
#include "sched/length_predictor.h"
#include "sched/scheduler.h"
#include "sched/step_cost_fit.h"
#include "base/sla.h"

namespace metro::sched {

class SchedMetrics;

struct SlaSchedulerConfig {
  SchedulerConfig base;
  SlaConfig sla;
  int levels = 4;                   // MLFQ levels per class (1..16)
  // A prompt token's work in output-token units. 1 suits a compute-bound CPU engine, where
  // prefilling a token costs about what decoding one does; GPUs want far less.
  double prefill_token_cost = 1.0;
  // Sequences of a class and the classes above it that may hold KV at once (so a realtime
  // arrival finds a seat when batch has filled them); 0: base.max_seqs.
  int max_running_seqs = 0;
  double kv_watermark = 0.02;       // share of KV blocks admissions below realtime leave free
  // No new admissions while the running sequences' decodes would take more than this share
  // of the step's budget (the seat count: budget x share / the mean running decode's cost).
  // 1: admit while the decodes still fit the step. Below 1 keeps room for prompts, which
  // with dear decodes (long contexts) leaves short prompts waiting for seats held by long
  // requests (docs/scheduling.md, "On the engine as measured"; `--decode-share`).
  double decode_share = 1.0;
  double starving_prefill_share = 0.5;  // budget share the starvation lane may take per step
  // Inside a class a prompt starves (shorter work kept arriving) only after this many times
  // the class's `starve`: a request that late has long missed its objective, and moving it
  // first costs others theirs, so this is a liveness guarantee, not a latency one.
  double in_class_starve_factor = 4.0;
  VtcWeights vtc;
  // The step cost model the SLO-driven budget starts from; refitted from observe_step().
  StepCostModel cost;
  double step_per_ttft = 0.25;      // a step may take at most this fraction of a class's TTFT
  // ... and this fraction of the TPOT of a class that is decoding: the rest is margin for
  // the cost model's error (attention grows with context) and for steps a decode sits out.
  double step_per_tpot = 0.8;
  // Decodes ahead of that pace (TPOT is a mean over the request) lend their slack to the
  // step: it may run longer while every decode stays on pace (see decode_allowance_s).
  // `--tpot-slack on|off` (docs/scheduling.md, "Step cap and TPOT slack").
  bool tpot_slack = true;
  // What a decode banks with tpot_slack: each token delivered sooner than this share of its
  // class's TPOT objective banks the difference (steps at pace, step_per_tpot x TPOT, bank
  // the margin between the two). Below 1 for the cost model's error. In [step_per_tpot, 1].
  double tpot_slack_share = 0.9;
  // Whether a class's TPOT objective caps the step also when only prompts of its own class
  // (or higher) wait (the default; `metro serve --tpot-cap all`). Off (`--tpot-cap lower`),
  // it protects a class from lower classes' prompts only: inside a class, steps take
  // max_batch_tokens as under FCFS up to step_per_ttft x the class's TTFT objective (an
  // arrival of the class must not wait behind a long step), for a lower mean TTFT and a
  // TPOT the class's own prompts may break (docs/scheduling.md, "Step cap and TPOT slack").
  bool tpot_cap_own_class = true;
  double class_memory_s = 60.0;     // a class counts as present this long after it had work
  int min_step_tokens = 16;         // the SLO-driven budget never goes below this
  // A step that prefills a realtime prompt carries no work of lower classes: each of their
  // tokens would make the realtime request's first token later.
  bool realtime_prefill_exclusive = true;
  // Null: a BucketQuantilePredictor of default configuration.
  std::shared_ptr<LengthPredictor> predictor;
  SchedMetrics* metrics = nullptr;  // preemptions and predictor accuracy go here when set
};

// Checks a configuration (ranges of every knob); errors name the field.
Status validate(const SlaSchedulerConfig& cfg);

class SlaScheduler : public Scheduler {
 public:
  // Inspection for tests, the engine's stats and the metrics endpoint.
  virtual double tenant_counter(SlaClass c, const std::string& tenant) const = 0;
  // The MLFQ level the sequence has now (0 is the top); -1 for an unknown sequence.
  virtual int level_of(const SeqState* seq) const = 0;
  // The budget the last schedule() used (max_batch_tokens unless the SLOs cut it).
  virtual int last_step_budget() const = 0;
  virtual const LengthPredictor& predictor() const = 0;
};

// `cfg` must pass validate().
std::unique_ptr<SlaScheduler> make_sla_scheduler(const SlaSchedulerConfig& cfg, kv::KvCacheManager& kv);

}  // namespace metro::sched
