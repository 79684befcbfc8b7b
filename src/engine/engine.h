// The engine: one thread running steps forever over a paged KV cache, the math of each step
// spread over a compute thread pool (its own, or one shared with the other engines of the
// process). A step runs in named stages (engine_step.cpp):
//
//   propose -> schedule -> build batch -> forward -> sample (verify drafts) -> update
//   -> pool embeddings -> emit -> report
//
//   auto engine = Engine::create(model, tokenizer, config);
//   Handle h = *engine->submit(request);          // thread-safe
//   while (auto e = h.stream->pop(timeout)) ...   // events until kDone
//   engine->abort(h.id);                          // frees its blocks before the next step
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/metrics.h"
#include "base/sla.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/adaptive/shadow_scorer.h"
#include "engine/adaptive/tier_controller.h"
#include "engine/request.h"
#include "engine/request_stream.h"
#include "engine/speculative/proposer.h"
#include "engine/step_observer.h"
#include "kernels/dtype.h"
#include "kv/file_spill.h"
#include "kv/kv_events.h"
#include "kv/prefix_hint.h"
#include "model/model.h"
#include "sched/queue_order.h"
#include "sched/sched_metrics.h"
#include "sched/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace metro::engine {

// Who shares prefix-cache blocks. A hit is visible to the requester (`cached_tokens` in
// the usage, and a shorter time to first token), so a cache shared by every tenant tells
// one tenant, block by block, whether another sent the same prompt.
enum class PrefixCacheScope : uint8_t {
  kTenant,  // blocks are shared only between requests of the same tenant (the default)
  kGlobal,  // every request of the model shares them (more hits; leaks timing between tenants)
};

struct EngineConfig {
  int n_threads = 0;               // compute threads of its own pool; 0: physical cores
  // A compute pool shared with other engines (steps of the engines take turns on it);
  // null: the engine makes its own of n_threads.
  std::shared_ptr<ThreadPool> pool;
  int64_t kv_memory_bytes = 0;     // KV budget in bytes (--kv-memory); 0: use ctx_total
  int ctx_total = 0;               // KV budget in tokens (--ctx-total); 0: 64 Ki tokens
  int kv_block = 16;               // tokens per KV block (--kv-block)
  kernels::DType kv_type = kernels::DType::kF16;  // --kv-type f16|q8_0
  bool prefix_cache = true;        // --no-prefix-cache turns it off
  PrefixCacheScope prefix_cache_scope = PrefixCacheScope::kTenant;  // --prefix-cache-scope
  // A disk tier under the prefix cache (kv/file_spill.h): blocks memory evicts are kept in a
  // file of at most kv_spill_bytes in this directory and read back on later hits. Empty: off.
  std::string kv_spill_dir;        // --kv-spill-dir
  int64_t kv_spill_bytes = 0;      // --kv-spill-bytes
  // Receives, once per step that changed it, what the prefix cache stored and removed
  // (kv/kv_events.h), on the engine thread: it must only hand the events on. Null: off.
  std::function<void(std::vector<kv::KvEvent>)> kv_events;  // --kv-events
  int max_batch_tokens = 256;      // tokens per step (--max-batch-tokens)
  int max_seqs = 64;               // sequences per step (--max-seqs)
  int n_ctx = 0;                   // context per sequence; 0: the model's trained context
  std::string sched = sched::kDefaultPolicy;  // scheduling policy (--sched); sched::scheduler_names()
  // The policy's own options (--sched-opt key=value; sched::make_scheduler checks them).
  std::vector<std::pair<std::string, std::string>> sched_options;
  SlaConfig sla;                   // per-class objectives (--sla)
  size_t stream_capacity = 1024;   // events buffered per request before it is aborted
  int max_n = 16;                  // bound on Request::n
  uint64_t model_variant = 0;      // salts prefix-cache hashes
  // Speculative decoding: proposes up to max_draft_tokens per decoding sequence and step;
  // the step verifies them against the model (outputs are those without it). Null or 0: off.
  std::shared_ptr<speculative::Proposer> proposer;
  int max_draft_tokens = 0;
  // The controller (speculative/controller.h) picks how many of the proposed tokens each
  // step computes; false: all of them (tests, and measuring the proposer alone).
  bool adaptive_drafts = true;
  // Jump-forward: tokens a request's grammar forces (the only token its mask allows) are
  // drafted and verified in the step that finds them instead of one step each; the text is
  // the same either way. False: off (measuring it).
  bool jump_forward = true;
  // Precision tiers: the model given to create() is the high tier, `low_tier` (the same
  // architecture, vocabulary and KV geometry, other weights) the low one; both read and
  // write the same KV (its format does not depend on the weights), so a request keeps its KV
  // across a switch. Each step the controller picks the tier of requests not pinned to one;
  // a step with pinned requests of the other tier runs the two groups as two passes.
  // Realtime requests and embeddings are pinned to the high tier. Null: one tier.
  std::shared_ptr<const model::Model> low_tier;
  adaptive::TierControllerConfig tier_control;
  adaptive::ShadowConfig shadow;  // the quality monitor's sampling of low-tier outputs
};

struct Handle {
  uint64_t id = 0;
  std::shared_ptr<RequestStream> stream;
};

struct EngineStats {
  int waiting = 0;
  int running = 0;
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_used = 0;
  int32_t kv_blocks_cached = 0;
  uint64_t prefix_queries = 0;  // prompt tokens looked up in the prefix cache
  uint64_t prefix_hits = 0;     // of which found (restored from the spill tier among them)
  uint64_t restored_tokens = 0; // of which read back from the spill tier
  std::optional<kv::FileSpillStats> spill;  // the spill tier's (none: off)
  uint64_t prompt_tokens = 0;   // computed (not cached) prompt tokens
  uint64_t generated_tokens = 0;
  uint64_t draft_tokens = 0;     // drafts verified (speculative decoding)
  uint64_t accepted_tokens = 0;  // of which accepted
  // By draft source (speculative::DraftSource), and decoding sequence-steps by the number
  // of drafts they verified (index k, 0..max_draft_tokens; empty without a proposer).
  std::array<uint64_t, speculative::kNumDraftSources> spec_proposed{};
  std::array<uint64_t, speculative::kNumDraftSources> spec_accepted{};
  std::vector<uint64_t> spec_steps_by_k;
  double spec_fixed_s = 0.0;      // the controller's fitted fixed part of a step (0: unknown)
  double spec_draft_row_s = 0.0;  // and seconds per draft row
  uint64_t steps = 0;
  // Major page faults of the process while this engine's forward passes ran: weights or
  // KV read back from disk (swap, or pages the kernel dropped).
  uint64_t major_page_faults = 0;
  uint64_t preemptions = 0;
  uint64_t requests_finished = 0;
  uint64_t requests_aborted = 0;
  uint64_t requests_expired = 0;  // of those: no first output by the request's deadline
  double step_seconds_total = 0.0;
  double last_step_ms = 0.0;
  int last_batch_tokens = 0;
  int last_batch_seqs = 0;
  sched::SchedulerStats scheduler;  // the policy's snapshot after the last step
  // Precision tiers (EngineConfig::low_tier; all zero without one).
  bool tiers = false;
  adaptive::TierControllerStats tier;
  std::array<uint64_t, adaptive::kNumTiers> tier_steps{};   // forward passes per tier
  std::array<uint64_t, adaptive::kNumTiers> tier_tokens{};  // tokens computed per tier
  std::array<size_t, adaptive::kNumTiers> tier_bytes{};     // weight bytes per tier
  adaptive::ShadowSnapshot shadow;
  // Step duration and batch size distributions since start: Prometheus-style cumulative
  // buckets (le bounds in engine.cpp).
  std::vector<uint64_t> step_ms_buckets;
  std::vector<uint64_t> batch_tokens_buckets;
  static const std::vector<double>& step_ms_bounds();
  static const std::vector<double>& batch_tokens_bounds();
};

class Engine {
 public:
  static Expected<std::unique_ptr<Engine>> create(std::shared_ptr<const model::Model> model,
                                                  tokenizer::Tokenizer tokenizer,
                                                  const EngineConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request. Errors: invalid_argument (bad ids, empty prompt, bad
  // sampling), out_of_range (prompt + max_tokens beyond the context or the KV capacity),
  // unavailable (shutting down).
  Expected<Handle> submit(Request request);
  // Several requests at once, one result per request in order: those that pass validation
  // enter the intake together, so an idle engine starts them in the same step.
  std::vector<Expected<Handle>> submit_all(std::vector<Request> requests);
  // submit()'s checks alone: to refuse at once a request that will be submitted later.
  Status check(const Request& r) const;
  // Ends a request early (finish reason abort); its blocks are freed before the next step.
  void abort(uint64_t id);
  // The front door refused a request for lack of capacity at steady-clock time now_ns (load
  // the engine never sees in its queue; the precision tier controller counts it). Any thread.
  void note_overload(int64_t now_ns);
  EngineStats stats() const;
  // Seconds since the engine last made progress while it had requests (a step that planned
  // work ended, or it had none): 0 when idle. Grows while steps plan nothing or a step
  // hangs; the gateway's circuit breaker reads it. Any thread.
  double seconds_without_progress() const;

  // Stops taking requests; in-flight ones finish with reason abort. Joins the thread.
  void shutdown();

  // Adds an observer of every step (called on the engine thread after each step). Any
  // thread; the engine keeps it alive until the engine is destroyed.
  void add_observer(std::shared_ptr<StepObserver> observer);
  // Registers this engine's series (queues, KV, tokens, steps, the policy's state, per-class
  // latency) under `model_label` (the `model` label of each series). Destroy the
  // registration before the engine.
  [[nodiscard]] metrics::Registration export_metrics(metrics::Registry& registry, const std::string& model_label) const;
  // The same under a label read at every scrape (it may be renamed while the engine runs).
  [[nodiscard]] metrics::Registration export_metrics(metrics::Registry& registry,
                                                     std::shared_ptr<const metrics::SharedLabel> model_label) const;

  const model::Model& model() const { return *model_; }
  std::shared_ptr<const model::Model> shared_model() const { return model_; }
  // Called on the engine thread with the tokens (prompt, then the first choice's output) of
  // every generate request that completes (not aborted, not failed); keep it cheap. Null
  // removes it. Any thread.
  using OutputSink = std::function<void(const std::vector<int32_t>& tokens, int n_prompt)>;
  void set_output_sink(OutputSink sink);
  const tokenizer::Tokenizer& tokenizer() const { return tokenizer_; }
  const EngineConfig& config() const { return cfg_; }
  int n_ctx() const { return n_ctx_; }
  int64_t kv_capacity_tokens() const;
  // Leading prompt tokens the prefix cache holds now (whole blocks; 0 with it off), or, with
  // `with_pending`, holds or is about to hold: prefixes of prompts registered with
  // hold_pending_prefix count too. Any thread; an estimate, since blocks may be evicted
  // before the request runs, and a pending prompt may run after the one asking.
  // `tenant`: the requester (the cache is scoped per tenant unless configured global).
  // With a spill tier (--kv-spill-dir), blocks it holds count too: they are read back.
  int cached_prefix_tokens(std::span<const int32_t> prompt, bool with_pending = false,
                           std::string_view tenant = {}, int16_t adapter = 0) const;
  // Starts reading the blocks of the prompt's prefix that the spill tier holds into memory
  // (the tier's thread), so that its first step restores them without waiting on the disk.
  // Returns the blocks asked for (0 without a spill tier). Any thread: admission calls it.
  int prefetch_prefix(std::span<const int32_t> prompt, std::string_view tenant = {}, int16_t adapter = 0) const;
  // Registers an admitted prompt whose prefix the engine will compute, until the returned
  // hold is dropped (when its first token is out or it ends). Null with the prefix cache off.
  std::shared_ptr<const kv::PendingPrefix> hold_pending_prefix(std::span<const int32_t> prompt,
                                                                std::string_view tenant = {},
                                                                int16_t adapter = 0) const;
  // The prefix-cache scope of a tenant's requests with a LoRA adapter (0: none)
  // (KvCacheManager::computed_blocks): each adapter's KV differs, so each salts it.
  uint64_t cache_scope(std::string_view tenant, int16_t adapter = 0) const;
  size_t kv_bytes() const;
  size_t workspace_bytes() const;
  const char* scheduler_name() const;
  // How the running policy orders waiting prompts (admission control's model of the queue).
  std::shared_ptr<const sched::QueueOrder> queue_order() const;
  // Per-class latency histograms, SLO attainment and predictor accuracy (thread-safe).
  const sched::SchedMetrics& sched_metrics() const;

  struct Impl;

 private:
  Engine(std::shared_ptr<const model::Model> model, tokenizer::Tokenizer tokenizer,
         const EngineConfig& cfg);
  std::shared_ptr<const model::Model> model_;
  tokenizer::Tokenizer tokenizer_;
  EngineConfig cfg_;
  int n_ctx_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace metro::engine
