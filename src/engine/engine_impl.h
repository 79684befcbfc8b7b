// Internal to the engine: the state behind Engine, shared by engine.cpp (the public API and
// set-up), engine_step.cpp (the step's stages) and engine_metrics.cpp (exposition).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <queue>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/sampling.h"
#include "engine/speculative/controller.h"
#include "engine/stop_matcher.h"
#include "kv/kv_arena.h"
#include "kv/kv_cache_manager.h"
#include "sched/sched_metrics.h"
#include "tokenizer/tokenizer.h"

namespace metro::engine {

struct ActiveRequest;

// One generated sequence (a choice) of a request.
struct Choice {
  ActiveRequest* req = nullptr;
  int index = 0;
  sched::SeqState seq;
  std::unique_ptr<Sampler> sampler;
  TokenHistory history;
  std::unique_ptr<tokenizer::IncrementalDetokenizer> detok;
  std::unique_ptr<StopMatcher> stop;
  bool finished = false;
  bool in_scheduler = false;
  // Structured output: where the text is in the request's grammar, and the mask scratch.
  std::unique_ptr<grammar::Matcher> matcher;
  grammar::TokenMask mask;
  bool grammar_stuck = false;  // the grammar allowed no token (the choice ends with an error)
  // Request::grammar_trigger: the output's last bytes while the trigger is awaited (at most
  // its length - 1 before each new token's), and whether it no longer is.
  std::string trigger_tail;
  bool trigger_done = false;
  speculative::DraftSource draft_source = speculative::DraftSource::kNone;  // of this step's draft
  adaptive::Tier tier = adaptive::Tier::kHigh;  // precision tier of the step that computed it last
  // The tier its KV was computed with while waiting and since (the prefix-cache scope it
  // looks up and publishes in), and whether a switch has since mixed both tiers into it.
  adaptive::Tier kv_tier = adaptive::Tier::kHigh;
  bool kv_mixed = false;
};

struct ActiveRequest {
  uint64_t id = 0;
  Request req;
  std::shared_ptr<RequestStream> stream;
  std::vector<std::unique_ptr<Choice>> choices;
  bool children_pending = false;  // choices 1..n-1 wait for choice 0's prompt
  int n_finished = 0;
  bool aborting = false;
  int64_t arrival_ns = 0;
  int64_t first_token_ns = 0;
  int64_t last_token_ns = 0;
  bool completed = false;  // kDone pushed; destroyed by reap() after the step
  std::vector<double> embed_sum;
  int embed_rows = 0;
  Usage usage;
};

// What sampling decided for one entry of the plan.
struct Sampled {
  int first_row = -1;  // the entry's first logits row (-1: it did not sample)
  int n_accepted = 0;  // drafts accepted
  // The accepted drafts, then the token sampled after them; all already in seq.tokens.
  std::vector<SampleResult> tokens;
};

struct Engine::Impl {
  Engine* self = nullptr;
  kernels::KvPageLayout layout;
  std::unique_ptr<kv::KvArena> arena;
  // Declared between the arena it reads and the KV manager that calls it.
  std::unique_ptr<kv::FileSpillTier> spill;
  std::unique_ptr<kv::KvCacheManager> kv;
  std::unique_ptr<sched::Scheduler> sched;
  std::shared_ptr<const sched::QueueOrder> queue_order;
  std::shared_ptr<const kv::PrefixHint> prefix_hint;  // kv's, readable from any thread
  kv::KvEventLog kv_event_log;  // what the prefix cache stored and removed (--kv-events)
  sched::SchedMetrics metrics;
  explicit Impl(const SlaConfig& sla) : metrics(sla) {}
  std::shared_ptr<ThreadPool> pool;
  model::Workspace ws;
  // Precision tiers (EngineConfig::low_tier): the low tier's workspace, the controller, the
  // quality monitor's scorer, and this step's decision.
  model::Workspace ws_low;
  std::unique_ptr<adaptive::TierController> tiers;
  std::unique_ptr<adaptive::ShadowScorer> shadow;
  adaptive::TierDecision decision;
  uint64_t shadow_seen = 0;     // the scorer's generation last acted on
  std::atomic<int64_t> last_overload_ns{0};  // Engine::note_overload(); 0: never
  // Engine::seconds_without_progress(): when the last step with work ended, or the engine
  // was last seen without requests; whether it has requests now.
  std::atomic<int64_t> progress_ns{0};
  std::atomic<bool> has_requests{false};
  double tpot_ewma_s = 0.0;     // smoothed seconds of steps with decodes
  uint64_t step_count_for_spill = 0;  // the spill tier's recompute cost is refreshed every 64 steps
  std::array<uint64_t, adaptive::kNumTiers> tier_steps{};
  std::array<uint64_t, adaptive::kNumTiers> tier_tokens{};
  std::vector<sched::ScheduledSeq> plan_scratch;
  model::Batch sub_batch;
  std::vector<std::span<const kv::BlockId>> sub_tables;
  SamplerScratch scratch;
  std::mt19937_64 seed_rng{0x5eed};

  // Intake, shared with submit()/abort().
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<ActiveRequest>> intake;
  std::vector<uint64_t> abort_ids;
  bool stopping = false;
  std::atomic<uint64_t> next_id{1};
  std::thread thread;

  // Observers: added from any thread, called on the engine thread from a copy refreshed
  // when the version moves.
  std::mutex observers_mu;
  std::mutex sink_mu;
  Engine::OutputSink output_sink;  // under sink_mu
  std::vector<std::shared_ptr<StepObserver>> observers;
  std::atomic<uint64_t> observers_version{0};
  std::vector<std::shared_ptr<StepObserver>> observers_seen;
  uint64_t observers_seen_version = 0;

  // Engine-thread state.
  std::unordered_map<uint64_t, std::unique_ptr<ActiveRequest>> active;
  std::unordered_map<uint64_t, Choice*> by_seq;  // sequence id -> choice
  uint64_t next_seq_id = 1;
  model::Batch batch;
  std::vector<std::span<const kv::BlockId>> tables;
  std::vector<Sampled> sampled;       // per plan entry, reused across steps
  std::vector<int32_t> proposal;      // proposer scratch
  std::vector<uint64_t> plan_ids;     // report(): the step's sequence ids, sorted
  speculative::DraftController controller;
  std::vector<speculative::DraftCandidate> candidates;
  int last_prefill_tokens = 0;        // prompt tokens of the last step (drafts excluded)
  double last_step_s = 0.0;           // the last step's seconds, a draft model's passes excluded
  double propose_s = 0.0;             // this step's seconds in a draft model's passes
  uint64_t step_faults = 0;  // major page faults of this step's forward pass
  // Since when steps have planned nothing while requests wait (0: the last one planned
  // work), and whether that stretch has been reported.
  int64_t idle_since_ns = 0;
  bool idle_reported = false;
  std::vector<speculative::DraftJob> draft_jobs;     // a model proposer's jobs of the step
  std::vector<std::vector<int32_t>> draft_tokens;    // and their drafts, by candidate
  // Speculation counters (engine thread), copied into stats after each step.
  std::array<uint64_t, speculative::kNumDraftSources> spec_proposed{};
  std::array<uint64_t, speculative::kNumDraftSources> spec_accepted{};
  std::vector<uint64_t> spec_steps_by_k;
  std::vector<uint64_t> completed_ids;
  // First-output deadlines of active requests, soonest on top (entries of requests that
  // ended or got their first output are dropped when they surface).
  std::priority_queue<std::pair<int64_t, uint64_t>, std::vector<std::pair<int64_t, uint64_t>>, std::greater<>>
      deadlines;

  mutable std::mutex stats_mu;
  EngineStats stats;

  void loop();
  void admit(std::unique_ptr<ActiveRequest> r);

  // The step and its stages (engine_step.cpp).
  void step();
  // Precision tiers: the controller's decision for this step, the tier a choice runs in, the
  // forward pass of a plan whose entries are ordered high tier first, and the quality check.
  void decide_tier(int64_t now);
  adaptive::Tier tier_of(const Choice& c) const;
  Expected<model::ForwardOutput> forward_tiers(const sched::StepPlan& plan, const model::ForwardOptions& fo);
  void check_quality(int64_t now);
  void offer_shadow(ActiveRequest& r);
  void propose();
  void take_draft(Choice& c, speculative::DraftSource source, const std::vector<int32_t>& tokens);
  // Jump-forward: the tokens c's grammar forces next (each the only token its mask allows),
  // at most `room`, into c.seq.draft.
  bool forced_draft(Choice& c, int room);
  static constexpr int kMaxForcedTokens = 16;
  grammar::TokenMask forced_mask;
  bool build_batch(const sched::StepPlan& plan, bool* want_hidden);
  void sample(const sched::StepPlan& plan, const model::ForwardOutput& out, sched::StepResult* result);
  void pool_embeddings(const sched::StepPlan& plan, const model::ForwardOutput& out);
  void emit(const sched::StepPlan& plan, const model::ForwardOutput& out);
  void report(const sched::StepPlan& plan, const model::ForwardOutput& out, const backends::StepProfile& profile,
              int64_t t0);

  // Sampling and emission of one choice's tokens.
  SampleResult sample_one(Choice& c, std::span<const float> logits);
  void count_drafts(Choice& c, const sched::ScheduledSeq& ss, int accepted);
  void publish_spec_stats();
  void emit_token(Choice& c, SampleResult s, size_t keep_tokens);
  void fork_children(ActiveRequest& r, std::span<const float> logits);
  void finish_choice(Choice& c, FinishReason reason, const std::string& message = {});
  void emit_delta(Choice& c, std::string text, std::vector<TokenInfo> tokens);
  void watch_trigger(Choice& c, SampleResult& s);
  void finish_embedding(Choice& c);
  void abort_request(ActiveRequest& r, const std::string& message, const std::string& code = {});
  // Ends the requests whose deadline passed before their first output, and those whose
  // output stalled past their max_stall_ns.
  void expire_deadlines(int64_t now);
  void expire_stalls(int64_t now);
  int64_t last_stall_check_ns = 0;
  int n_stall_bounded = 0;  // active requests with a max_stall_ns
  void maybe_complete(ActiveRequest& r);
  void reap();
  void publish_stats(double step_ms, int batch_tokens, int batch_seqs);
  void refresh_gauges_locked();
  const std::vector<std::shared_ptr<StepObserver>>& current_observers();
};

}  // namespace metro::engine
