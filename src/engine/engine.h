// The engine: one thread running steps forever (intake -> schedule -> execute -> sample ->
// emit) over a paged KV cache, the math of each step spread over a compute thread pool.
//
//   auto engine = Engine::create(model, tokenizer, config);
//   Handle h = *engine->submit(request);          // thread-safe
//   while (auto e = h.stream->pop(timeout)) ...   // events until kDone
//   engine->abort(h.id);                          // frees its blocks before the next step
#pragma once

#include <atomic>
#include <array>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/request.h"
#include "engine/request_stream.h"
#include "kernels/dtype.h"
#include "model/model.h"
#include "sched/sched_metrics.h"
#include "sched/scheduler.h"
#include "sched/sla_config.h"
#include "tokenizer/tokenizer.h"

namespace metro::kv {
class KvArena;
class KvCacheManager;
}  // namespace metro::kv

namespace metro::engine {

struct EngineConfig {
  int n_threads = 0;               // compute threads; 0: physical cores
  int64_t kv_memory_bytes = 0;     // KV budget in bytes (--kv-memory); 0: use ctx_total
  int ctx_total = 0;               // KV budget in tokens (--ctx-total); 0: 64 Ki tokens
  int kv_block = 16;               // tokens per KV block (--kv-block)
  kernels::DType kv_type = kernels::DType::kF16;  // --kv-type f16|q8_0
  bool prefix_cache = true;        // --no-prefix-cache turns it off
  int max_batch_tokens = 256;      // tokens per step (--max-batch-tokens)
  int max_seqs = 64;               // sequences per step (--max-seqs)
  int n_ctx = 0;                   // context per sequence; 0: the model's trained context
  std::string sched = "sla";       // scheduling policy: sla | fcfs (--sched)
  sched::SlaConfig sla;            // per-class objectives (--sla)
  bool tpot_slack = true;          // decodes ahead of their TPOT pace yield to prompts (--tpot-slack)
  std::string step_trace;          // file for one line per engine step (--step-trace); empty: none
  bool tpot_cap_own_class = true;  // a class's TPOT caps steps with its own prompts too (--tpot-cap all)
  // Share of a step's time the running sequences' decodes may fill before admissions stop
  // (--decode-share; sched::SlaSchedulerConfig::decode_share). 0: the scheduler's default.
  double decode_share = 0.0;
  size_t stream_capacity = 1024;   // events buffered per request before it is aborted
  int max_n = 16;                  // bound on Request::n
  uint64_t model_variant = 0;      // salts prefix-cache hashes
  // Called on the engine thread after every step (keep it short; never block).
  std::function<void(const struct StepReport&)> on_step;
};

// What one step did, for admission control and metrics.
struct StepReport {
  double step_s = 0.0;
  int prefill_tokens = 0;
  int decode_seqs = 0;
  double prefill_pairs = 0.0;  // (query, key) pairs of the prompt chunks
  double decode_ctx = 0.0;     // keys the decodes attended to
  int logit_rows = 0;          // rows the step computed logits for (decodes, prompts that ended)
  double attention_s = 0.0;    // of step_s, the attention phases (model::ForwardOutput)
  std::array<int, sched::kNumSlaClasses> prefill_tokens_by_class{};
  std::array<int, sched::kNumSlaClasses> waiting_by_class{};  // after the step
  std::array<int, sched::kNumSlaClasses> running_by_class{};
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
  uint64_t prefix_hits = 0;     // of which found
  uint64_t prompt_tokens = 0;   // computed (not cached) prompt tokens
  uint64_t generated_tokens = 0;
  uint64_t steps = 0;
  uint64_t preemptions = 0;
  uint64_t requests_finished = 0;
  uint64_t requests_aborted = 0;
  double step_seconds_total = 0.0;
  double last_step_ms = 0.0;
  int last_batch_tokens = 0;
  int last_batch_seqs = 0;
  // The SLA policy's step budget (tokens) of the last step, and the step cost model the
  // engine fitted to its steps (seconds; all zero until it has one), which the SLA policy
  // cuts steps with (fitted under FCFS too, where nothing uses it but /metrics).
  int step_budget_tokens = 0;
  double cost_fixed_s = 0.0;
  double cost_per_prefill_token_s = 0.0;
  double cost_per_decode_seq_s = 0.0;
  double cost_per_attention_pair_s = 0.0;
  double cost_per_decode_ctx_s = 0.0;
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
  // submit()'s checks alone (it normalizes an embedding request's n and max_tokens): to
  // refuse a request at once that will be submitted later.
  Status validate(Request& r) const;
  // Ends a request early (finish reason abort); its blocks are freed before the next step.
  void abort(uint64_t id);
  EngineStats stats() const;

  // Stops taking requests; in-flight ones finish with reason abort. Joins the thread.
  void shutdown();

  const model::Model& model() const { return *model_; }
  const tokenizer::Tokenizer& tokenizer() const { return tokenizer_; }
  const EngineConfig& config() const { return cfg_; }
  int n_ctx() const { return n_ctx_; }
  int64_t kv_capacity_tokens() const;
  // Leading prompt tokens the prefix cache holds now (whole blocks; 0 with it off), or, with
  // `with_pending`, holds or is about to hold: prefixes of prompts registered with
  // hold_pending_prefix count too. Any thread; an estimate, since blocks may be evicted
  // before the request runs, and a pending prompt may run after the one asking.
  int cached_prefix_tokens(std::span<const int32_t> prompt, bool with_pending = false) const;
  // Registers an admitted prompt whose prefix the engine will compute, until the handle is
  // dropped (when its first token is out or it ends). Null with the prefix cache off.
  std::shared_ptr<const void> hold_pending_prefix(std::span<const int32_t> prompt) const;
  size_t kv_bytes() const;
  size_t workspace_bytes() const;
  const char* scheduler_name() const;
  // Per-class latency histograms, SLO attainment and predictor accuracy (thread-safe).
  const sched::SchedMetrics& sched_metrics() const;
  // The same registry, for the gateway to count its refusals in (SchedMetrics is thread-safe).
  sched::SchedMetrics& sched_metrics();

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
