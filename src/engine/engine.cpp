#include "engine/engine.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "base/clock.h"
#include "base/cpu_features.h"
#include "base/hash.h"
#include "base/log.h"
#include "engine/engine_impl.h"

namespace metro::engine {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "error";
}

const std::vector<double>& EngineStats::step_ms_bounds() {
  static const std::vector<double> b = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000};
  return b;
}
const std::vector<double>& EngineStats::batch_tokens_bounds() {
  static const std::vector<double> b = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048};
  return b;
}

Engine::Engine(std::shared_ptr<const model::Model> model, tokenizer::Tokenizer tokenizer,
               const EngineConfig& cfg)
    : model_(std::move(model)), tokenizer_(std::move(tokenizer)), cfg_(cfg) {}

namespace {

// Bytes of a model's weight tensors.
size_t weight_bytes(const model::Model& m) {
  size_t n = 0;
  for (const auto& t : m.file().tensors()) n += t.n_bytes;
  return n;
}

// A low tier must compute the same thing from other weights: the same architecture and
// shapes, the same vocabulary, the same KV pages (both tiers read and write one arena) on the
// same backend, whole models.
Status check_tiers(const model::Model& high, const model::Model& low, const EngineConfig& cfg) {
  const model::HParams& a = high.hparams();
  const model::HParams& b = low.hparams();
  if (a.architecture != b.architecture || a.n_embd != b.n_embd || a.n_layer != b.n_layer || a.n_head != b.n_head ||
      a.n_head_kv != b.n_head_kv || a.head_dim != b.head_dim || a.head_dim_v != b.head_dim_v || a.n_ff != b.n_ff ||
      a.n_vocab != b.n_vocab || a.n_rot != b.n_rot) {
    return invalid_argument("the low tier is not the same model as the high tier (architecture, shapes or vocabulary differ)");
  }
  if (high.kv_layout(cfg.kv_type, cfg.kv_block).page_bytes() != low.kv_layout(cfg.kv_type, cfg.kv_block).page_bytes() ||
      high.kv_layers() != low.kv_layers() || high.kv_layers() != static_cast<int>(a.n_layer)) {
    return invalid_argument("precision tiers need whole models with the same KV geometry");
  }
  if (high.backend()->name() != low.backend()->name()) {
    return invalid_argument("precision tiers must run on the same backend");
  }
  return {};
}

}  // namespace

Expected<std::unique_ptr<Engine>> Engine::create(std::shared_ptr<const model::Model> model,
                                                 tokenizer::Tokenizer tokenizer,
                                                 const EngineConfig& config) {
  const model::HParams& hp = model->hparams();
  EngineConfig cfg = config;
  if (cfg.kv_block < 1 || cfg.kv_block > 1024) return invalid_argument("--kv-block must be in [1, 1024]");
  if (cfg.kv_type != kernels::DType::kF16 && cfg.kv_type != kernels::DType::kQ8_0) {
    return invalid_argument("--kv-type must be f16 or q8_0");
  }
  if (cfg.kv_type == kernels::DType::kQ8_0 && hp.head_dim % 32 != 0) {
    return invalid_argument("--kv-type q8_0 needs a head dimension that is a multiple of 32");
  }
  if (cfg.max_batch_tokens < 1 || cfg.max_seqs < 1) {
    return invalid_argument("--max-batch-tokens and --max-seqs must be positive");
  }
  if (cfg.max_draft_tokens < 0 || cfg.max_draft_tokens > 64) {
    return invalid_argument("the number of draft tokens must be in [0, 64]");
  }
  // Sampling draws from every row of the output matrix: each row needs a token to print, and
  // each token a row (a file's own vocabulary is checked at load, model/hparams.cpp; this
  // covers a tokenizer from elsewhere).
  if (tokenizer.n_vocab() != static_cast<int32_t>(hp.n_vocab)) {
    return invalid_argument("the tokenizer has " + std::to_string(tokenizer.n_vocab()) + " tokens but the model's " +
                            (hp.tied_output ? "output matrix 'token_embd.weight'" : "output matrix 'output.weight'") +
                            " has " + std::to_string(hp.n_vocab) + " rows; they must match");
  }
  if (hp.encoder) {
    if (cfg.proposer || cfg.low_tier) {
      return invalid_argument("an encoder model makes embeddings only: no speculation or precision tiers");
    }
    // A whole input is computed in one step (bidirectional attention): the step takes the
    // longest one.
    const int ctx = cfg.n_ctx > 0 ? std::min<int>(cfg.n_ctx, static_cast<int>(hp.n_ctx_train))
                                  : static_cast<int>(hp.n_ctx_train);
    cfg.max_batch_tokens = std::max(cfg.max_batch_tokens, ctx);
  }
  auto e = std::unique_ptr<Engine>(new Engine(std::move(model), std::move(tokenizer), cfg));
  auto impl = std::make_unique<Impl>(cfg.sla);
  impl->self = e.get();
  const int max_ctx = static_cast<int>(e->model_->max_context());
  e->n_ctx_ = cfg.n_ctx > 0 ? std::min<int>(cfg.n_ctx, max_ctx) : max_ctx;
  if (max_ctx < static_cast<int>(hp.n_ctx_train) && (cfg.n_ctx == 0 || cfg.n_ctx > max_ctx)) {
    METRO_LOG_INFO("context capped at the model's %d-token attention window (trained for %u): "
                   "this backend has no windowed attention, and within the window full attention "
                   "is exact", max_ctx, hp.n_ctx_train);
  }

  // The KV arena holds this model's layers and KV heads (a shard's, when it is one), in its
  // backend's memory.
  const model::Model& m = *e->model_;
  impl->layout = m.kv_layout(cfg.kv_type, cfg.kv_block);
  const size_t block_bytes = impl->layout.page_bytes() * 2 * static_cast<size_t>(m.kv_layers());
  int64_t n_blocks;
  if (cfg.kv_memory_bytes > 0 && block_bytes > 0) {
    n_blocks = cfg.kv_memory_bytes / static_cast<int64_t>(block_bytes);
  } else {
    const int tokens = cfg.ctx_total > 0 ? cfg.ctx_total : 64 * 1024;
    n_blocks = (tokens + cfg.kv_block - 1) / cfg.kv_block;
  }
  if (n_blocks < 1) return invalid_argument("the KV budget holds less than one block");
  if (n_blocks > (1 << 24)) return invalid_argument("the KV budget is too large");
  impl->arena = std::make_unique<kv::KvArena>(m.backend(), m.kv_layers(), impl->layout, static_cast<int32_t>(n_blocks));
  kv::KvCacheConfig kc{static_cast<int32_t>(n_blocks), cfg.kv_block, cfg.prefix_cache, cfg.model_variant};
  kc.window = static_cast<int>(m.kv_release_window());
  kc.window_read_align = m.backend()->window_read_align();
  impl->kv = std::make_unique<kv::KvCacheManager>(kc);
  impl->prefix_hint = impl->kv->prefix_hint();
  if (cfg.kv_events && cfg.prefix_cache) impl->kv->set_event_log(&impl->kv_event_log);
  if (!cfg.kv_spill_dir.empty()) {
    if (!cfg.prefix_cache) return invalid_argument("--kv-spill-dir keeps prefix-cache blocks: it needs the prefix cache");
    kv::FileSpillConfig sc;
    sc.dir = cfg.kv_spill_dir;
    sc.max_bytes = cfg.kv_spill_bytes;
    METRO_ASSIGN_OR_RETURN(impl->spill, kv::FileSpillTier::open(sc, *impl->arena));
    impl->kv->set_spill(impl->spill.get());
    impl->spill->set_hint(impl->prefix_hint);
  }
  sched::SchedulerOptions so;
  so.base.max_batch_tokens = cfg.max_batch_tokens;
  so.base.max_seqs = cfg.max_seqs;
  // A verified draft needs a logits row too.
  // A row per sequence and per draft; tokens a grammar forces are drafts too (speculation
  // on or off), and past this room the scheduler drops drafts rather than pausing a decode.
  so.base.max_logits = cfg.max_seqs * (1 + (cfg.proposer ? cfg.max_draft_tokens : 0)) + 4 * Impl::kMaxForcedTokens;
  so.objectives = cfg.sla;
  so.policy = cfg.sched_options;
  so.metrics = &impl->metrics;
  METRO_ASSIGN_OR_RETURN(impl->sched, sched::make_scheduler(cfg.sched, so, *impl->kv));
  impl->queue_order = impl->sched->queue_order();
  if (cfg.pool) {
    impl->pool = cfg.pool;
  } else {
    impl->pool = std::make_shared<ThreadPool>(cfg.n_threads > 0 ? cfg.n_threads : cpu_features().physical_cores);
  }
  model::WorkspaceLimits lim;
  lim.max_tokens = cfg.max_batch_tokens;
  lim.max_logits = so.base.max_logits;
  lim.max_seqs = cfg.max_seqs;
  lim.max_blocks_per_seq = (e->n_ctx_ + cfg.kv_block - 1) / cfg.kv_block + 1;
  lim.n_ctx = e->n_ctx_;
  impl->ws = e->model_->make_workspace(lim);
  if (cfg.low_tier) {
    METRO_RETURN_IF_ERROR(check_tiers(m, *cfg.low_tier, cfg));
    impl->ws_low = cfg.low_tier->make_workspace(lim);
    impl->tiers = std::make_unique<adaptive::TierController>(cfg.tier_control);
    impl->decision.tier = impl->tiers->stats().tier;
    if (cfg.shadow.every > 0) {
      adaptive::ShadowConfig sc = cfg.shadow;
      sc.n_ctx = e->n_ctx_;
      impl->shadow = std::make_unique<adaptive::ShadowScorer>(e->model_, cfg.low_tier, sc);
    }
    impl->stats.tiers = true;
    impl->stats.tier = impl->tiers->stats();
    impl->stats.tier_bytes = {weight_bytes(m), weight_bytes(*cfg.low_tier)};
  }
  impl->stats.kv_blocks_total = static_cast<int32_t>(n_blocks);
  impl->stats.step_ms_buckets.assign(EngineStats::step_ms_bounds().size() + 1, 0);
  impl->stats.batch_tokens_buckets.assign(EngineStats::batch_tokens_bounds().size() + 1, 0);
  if (cfg.proposer && cfg.max_draft_tokens > 0) {
    cfg.proposer->calibrate(*impl->pool);
    impl->stats.spec_steps_by_k.assign(static_cast<size_t>(cfg.max_draft_tokens) + 1, 0);
    impl->spec_steps_by_k = impl->stats.spec_steps_by_k;
  }
  impl->stats.scheduler = impl->sched->stats();
  impl->seed_rng.seed(static_cast<uint64_t>(now_ns()));
  e->impl_ = std::move(impl);
  Impl* raw = e->impl_.get();
  raw->thread = std::thread([raw] { raw->loop(); });
  return e;
}

Engine::~Engine() { shutdown(); }

void Engine::shutdown() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) {
    impl_->thread.join();
    // The cache goes with the engine (a model unloaded or swapped): subscribers forget it.
    if (cfg_.kv_events && cfg_.prefix_cache) {
      impl_->kv_event_log.all_cleared();
      cfg_.kv_events(impl_->kv_event_log.take());
    }
  }
}

int64_t Engine::kv_capacity_tokens() const {
  return static_cast<int64_t>(impl_->arena->n_blocks()) * cfg_.kv_block;
}
size_t Engine::kv_bytes() const { return impl_->arena->bytes(); }
int Engine::cached_prefix_tokens(std::span<const int32_t> prompt, bool with_pending, std::string_view tenant,
                                 int16_t adapter) const {
  const auto& hint = impl_->prefix_hint;
  // Blocks the spill tier holds are read back, not computed: they count as cached.
  return hint ? hint->cached_tokens(prompt, with_pending, cache_scope(tenant, adapter), impl_->spill != nullptr) : 0;
}
int Engine::prefetch_prefix(std::span<const int32_t> prompt, std::string_view tenant, int16_t adapter) const {
  const auto& hint = impl_->prefix_hint;
  if (!impl_->spill || !hint) return 0;
  const std::vector<uint64_t> chain = hint->spilled_chain(prompt, cache_scope(tenant, adapter));
  if (!chain.empty()) impl_->spill->prefetch(chain);
  return static_cast<int>(chain.size());
}
std::shared_ptr<const kv::PendingPrefix> Engine::hold_pending_prefix(std::span<const int32_t> prompt,
                                                                     std::string_view tenant, int16_t adapter) const {
  const auto& hint = impl_->prefix_hint;
  return hint ? hint->hold_pending(prompt, cache_scope(tenant, adapter)) : nullptr;
}
uint64_t Engine::cache_scope(std::string_view tenant, int16_t adapter) const {
  // An adapter's salt: its id mixed, never 0, so no adapter shares the base's blocks.
  const uint64_t salt = adapter == 0 ? 0 : hash_bytes(&adapter, sizeof(adapter), 0x6c6f7261ull) | 2u;
  if (cfg_.prefix_cache_scope == PrefixCacheScope::kGlobal) return salt;
  // Never 0 (the global scope), whatever the tenant's name; "" is the anonymous tenant.
  return (hash_bytes(tenant.data(), tenant.size(), 0x74656e616e74ull) | 1u) ^ salt;
}
size_t Engine::workspace_bytes() const { return impl_->ws.bytes(); }
const char* Engine::scheduler_name() const { return impl_->sched->name(); }
std::shared_ptr<const sched::QueueOrder> Engine::queue_order() const { return impl_->queue_order; }
const sched::SchedMetrics& Engine::sched_metrics() const { return impl_->metrics; }

void Engine::add_observer(std::shared_ptr<StepObserver> observer) {
  if (!observer) return;
  std::lock_guard<std::mutex> lock(impl_->observers_mu);
  impl_->observers.push_back(std::move(observer));
  impl_->observers_version.fetch_add(1, std::memory_order_release);
}

Status Engine::check(const Request& r) const {
  const int32_t n_vocab = tokenizer_.n_vocab();
  if (r.prompt.empty()) return invalid_argument("the prompt is empty");
  for (int32_t id : r.prompt) {
    if (id < 0 || id >= n_vocab) {
      return invalid_argument("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(n_vocab) + ")");
    }
  }
  const int64_t prompt = static_cast<int64_t>(r.prompt.size());
  if (r.adapter < 0 || r.adapter > model_->n_adapters()) {
    return invalid_argument("LoRA adapter " + std::to_string(r.adapter) + " is not loaded (the model has " +
                            std::to_string(model_->n_adapters()) + ")");
  }
  if (r.adapter != 0 && cfg_.low_tier && cfg_.low_tier->n_adapters() < r.adapter) {
    return invalid_argument("LoRA adapter " + std::to_string(r.adapter) + " is not loaded in the low precision tier");
  }
  if (model_->hparams().encoder && r.kind != RequestKind::kEmbed) {
    return invalid_argument("this model is an encoder (" + model_->hparams().architecture +
                            "): it makes embeddings only");
  }
  int64_t max_tokens = 0;
  if (r.kind == RequestKind::kGenerate) {
    if (r.n < 1 || r.n > cfg_.max_n) return invalid_argument("n must be in [1, " + std::to_string(cfg_.max_n) + "]");
    if (r.stop.max_tokens < 1) return invalid_argument("max_tokens must be at least 1");
    METRO_RETURN_IF_ERROR(r.sampling.validate(n_vocab));
    for (int32_t id : r.stop.stop_token_ids) {
      if (id < 0 || id >= n_vocab) return invalid_argument("stop token id outside the vocabulary");
    }
    max_tokens = r.stop.max_tokens;
  }
  const int64_t need = prompt + max_tokens;
  if (need > n_ctx_) {
    return out_of_range("this model's context is " + std::to_string(n_ctx_) + " tokens; the request has " +
                        std::to_string(prompt) + " prompt tokens and max_tokens " + std::to_string(max_tokens) +
                        " (" + std::to_string(need) + " in all)");
  }
  if (need + cfg_.kv_block > kv_capacity_tokens()) {
    return out_of_range("the request needs " + std::to_string(need) + " tokens of KV cache; the engine holds " +
                        std::to_string(kv_capacity_tokens()));
  }
  return Status();
}

Expected<Handle> Engine::submit(Request r) {
  std::vector<Request> one;
  one.push_back(std::move(r));
  return std::move(submit_all(std::move(one)).front());
}

std::vector<Expected<Handle>> Engine::submit_all(std::vector<Request> requests) {
  std::vector<Expected<Handle>> out;
  out.reserve(requests.size());
  std::vector<std::unique_ptr<ActiveRequest>> ready;
  std::vector<size_t> slot;  // out index of each ready request
  for (Request& r : requests) {
    if (Status s = check(r); !s.ok()) {
      out.emplace_back(std::move(s));
      continue;
    }
    if (r.kind == RequestKind::kEmbed) {  // one pooled vector, nothing generated
      r.n = 1;
      r.stop.max_tokens = 0;
    }
    auto a = std::make_unique<ActiveRequest>();
    a->id = impl_->next_id.fetch_add(1);
    a->stream = std::make_shared<RequestStream>(a->id, std::max<size_t>(cfg_.stream_capacity, 4));
    a->req = std::move(r);
    out.emplace_back(Handle{a->id, a->stream});
    slot.push_back(out.size() - 1);
    ready.push_back(std::move(a));
  }
  if (ready.empty()) return out;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopping) {
      for (size_t i : slot) out[i] = unavailable("the engine is shutting down");
      return out;
    }
    for (auto& a : ready) impl_->intake.push_back(std::move(a));
  }
  impl_->cv.notify_one();
  return out;
}

void Engine::abort(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->abort_ids.push_back(id);
  }
  impl_->cv.notify_one();
}

void Engine::note_overload(int64_t now_ns) { impl_->last_overload_ns.store(now_ns, std::memory_order_relaxed); }

void Engine::set_output_sink(OutputSink sink) {
  std::lock_guard<std::mutex> lock(impl_->sink_mu);
  impl_->output_sink = std::move(sink);
}

double Engine::seconds_without_progress() const {
  if (!impl_->has_requests.load(std::memory_order_relaxed)) return 0.0;
  return std::max(0.0, static_cast<double>(now_ns() - impl_->progress_ns.load(std::memory_order_relaxed)) * 1e-9);
}

EngineStats Engine::stats() const {
  EngineStats st;
  {
    std::lock_guard<std::mutex> lock(impl_->stats_mu);
    st = impl_->stats;
  }
  // The scorer works between steps too (an idle engine's last samples).
  if (impl_->shadow) st.shadow = impl_->shadow->snapshot();
  return st;
}

// ---------------------------------------------------------------------------------------
// Engine thread: intake, admission of requests, the loop around step()

void Engine::Impl::loop() {
  for (;;) {
    std::vector<std::unique_ptr<ActiveRequest>> fresh;
    std::vector<uint64_t> aborts;
    bool stop_now = false;
    {
      std::unique_lock<std::mutex> lock(mu);
      if (active.empty()) {
        has_requests.store(false, std::memory_order_relaxed);
        progress_ns.store(now_ns(), std::memory_order_relaxed);
      }
      cv.wait(lock, [&] { return stopping || !intake.empty() || !abort_ids.empty() || !active.empty(); });
      if (active.empty()) progress_ns.store(now_ns(), std::memory_order_relaxed);  // idle until now
      fresh.swap(intake);
      aborts.swap(abort_ids);
      stop_now = stopping;
    }
    for (auto& r : fresh) admit(std::move(r));
    has_requests.store(!active.empty(), std::memory_order_relaxed);
    for (uint64_t id : aborts) {
      auto it = active.find(id);
      if (it != active.end()) abort_request(*it->second, "aborted");
    }
    if (!deadlines.empty()) expire_deadlines(now_ns());
    if (n_stall_bounded > 0) expire_stalls(now_ns());
    if (stop_now) {
      for (auto& [id, r] : active) abort_request(*r, "the server is shutting down");
      reap();
      return;
    }
    reap();
    if (!active.empty()) step();
    reap();
  }
}

void Engine::Impl::admit(std::unique_ptr<ActiveRequest> r) {
  const Request& q = r->req;
  const uint64_t base_seed = q.sampling.has_seed ? q.sampling.seed : seed_rng();
  // A constrained output is the text its grammar matched, control tokens as their text (the
  // trie reads them so: a tool-call format may open with one, as [TOOL_CALLS]).
  const tokenizer::DecodeOptions dopts{.render_special = q.grammar != nullptr, .strip_leading_space = false};
  r->arrival_ns = q.arrival_ns > 0 ? q.arrival_ns : now_ns();
  for (int i = 0; i < q.n; ++i) {
    auto c = std::make_unique<Choice>();
    c->req = r.get();
    c->index = i;
    c->seq.id = next_seq_id++;
    c->seq.tokens = q.prompt;
    c->seq.n_prompt = static_cast<int>(q.prompt.size());
    c->seq.max_new_tokens = q.stop.max_tokens;
    c->seq.arrival_ns = r->arrival_ns;
    c->seq.sla_class = q.sla_class;
    c->seq.tenant = q.tenant;
    c->seq.deadline_ns = q.deadline_ns;
    c->seq.prefix_hash = q.prefix_hash;
    c->seq.use_prefix_cache = q.kind == RequestKind::kGenerate;
    c->seq.whole_prompt = self->model_->hparams().encoder;
    c->seq.cache_scope = self->cache_scope(q.tenant, q.adapter);
    if (q.kind == RequestKind::kGenerate) {
      c->sampler = std::make_unique<Sampler>(q.sampling, base_seed + static_cast<uint64_t>(i));
      c->history.set_prompt(q.prompt);
      c->detok = std::make_unique<tokenizer::IncrementalDetokenizer>(self->tokenizer_, dopts);
      c->stop = std::make_unique<StopMatcher>(q.stop.stop);
      if (q.grammar && q.grammar_trigger.empty()) c->matcher = std::make_unique<grammar::Matcher>(q.grammar);
    }
    by_seq[c->seq.id] = c.get();
    r->choices.push_back(std::move(c));
  }
  r->usage.prompt_tokens = static_cast<int>(q.prompt.size());
  r->children_pending = q.n > 1;
  Choice& first = *r->choices[0];
  first.in_scheduler = true;
  sched->add(&first.seq);
  const uint64_t id = r->id;
  if (q.deadline_ns > 0) deadlines.emplace(q.deadline_ns, id);
  if (q.max_stall_ns > 0) ++n_stall_bounded;
  active.emplace(id, std::move(r));
}

void Engine::Impl::expire_stalls(int64_t now) {
  if (now - last_stall_check_ns < 50'000'000) return;  // a bound of seconds needs no finer check
  last_stall_check_ns = now;
  std::vector<ActiveRequest*> stalled;
  for (auto& [id, r] : active) {
    if (r->req.max_stall_ns <= 0 || r->first_token_ns == 0 || r->aborting || r->completed) continue;
    if (now - r->last_token_ns > r->req.max_stall_ns) stalled.push_back(r.get());
  }
  for (ActiveRequest* r : stalled) {
    char msg[160];
    std::snprintf(msg, sizeof(msg),
                  "no new token for %.1f s (paused by higher-priority work); the server is busier than when it was "
                  "admitted, retry later",
                  static_cast<double>(now - r->last_token_ns) * 1e-9);
    abort_request(*r, msg, "deadline_missed");
    std::lock_guard<std::mutex> lock(stats_mu);
    stats.requests_expired += 1;
  }
}

void Engine::Impl::expire_deadlines(int64_t now) {
  while (!deadlines.empty() && deadlines.top().first <= now) {
    const uint64_t id = deadlines.top().second;
    deadlines.pop();
    auto it = active.find(id);
    if (it == active.end()) continue;
    ActiveRequest& r = *it->second;
    if (r.first_token_ns != 0 || r.aborting || r.completed) continue;
    char msg[160];
    std::snprintf(msg, sizeof(msg),
                  "no output by its deadline (waited %.1f s); the server is busier than when it was admitted, "
                  "retry later",
                  static_cast<double>(now - r.arrival_ns) * 1e-9);
    abort_request(r, msg, "deadline_missed");
    {
      std::lock_guard<std::mutex> lock(stats_mu);
      stats.requests_expired += 1;
    }
  }
}

void Engine::Impl::reap() {
  for (uint64_t id : completed_ids) {
    auto it = active.find(id);
    if (it == active.end()) continue;
    if (it->second->req.max_stall_ns > 0) --n_stall_bounded;
    for (auto& c : it->second->choices) {
      by_seq.erase(c->seq.id);
      if (self->cfg_.proposer) self->cfg_.proposer->forget(c->seq.id);
      controller.forget(c->seq.id);
    }
    active.erase(it);
  }
  completed_ids.clear();
}

const std::vector<std::shared_ptr<StepObserver>>& Engine::Impl::current_observers() {
  const uint64_t v = observers_version.load(std::memory_order_acquire);
  if (v != observers_seen_version) {
    std::lock_guard<std::mutex> lock(observers_mu);
    observers_seen = observers;
    observers_seen_version = v;
  }
  return observers_seen;
}

// Queue and KV gauges from the scheduler and the KV manager (engine thread; stats_mu held).
void Engine::Impl::refresh_gauges_locked() {
  const sched::SchedulerStats ss = sched->stats();
  const auto ks = kv->stats();
  stats.waiting = ss.counts.waiting;
  stats.running = ss.counts.running;
  stats.preemptions = ss.counts.preemptions;
  stats.scheduler = ss;
  stats.kv_blocks_used = ks.blocks_used;
  stats.kv_blocks_cached = ks.blocks_cached;
  stats.prefix_queries = ks.prefix_queries;
  stats.prefix_hits = ks.prefix_hits;
  stats.restored_tokens = ks.restored_tokens;
  if (spill) stats.spill = spill->stats();
}

}  // namespace metro::engine
