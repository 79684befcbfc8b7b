#include "engine/engine.h"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <deque>
#include <random>
#include <unordered_map>

#include "base/clock.h"
#include "base/cpu_features.h"
#include "base/log.h"
#include "engine/stop_matcher.h"
#include "kv/kv_arena.h"
#include "kv/kv_cache_manager.h"
#include "sched/sla_scheduler.h"
#include "sched/step_cost_fit.h"

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

namespace {

void observe(std::vector<uint64_t>& buckets, const std::vector<double>& bounds, double v) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (v <= bounds[i]) ++buckets[i];
  }
  ++buckets[bounds.size()];  // +Inf
}

}  // namespace

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

struct Engine::Impl {
  Engine* self = nullptr;
  kernels::KvPageLayout layout;
  std::unique_ptr<kv::KvArena> arena;
  std::unique_ptr<kv::KvCacheManager> kv;
  std::unique_ptr<sched::Scheduler> sched;
  sched::SlaScheduler* sla = nullptr;  // sched, when it is the SLA policy
  std::shared_ptr<const kv::PrefixHint> prefix_hint;  // kv's, readable from any thread
  sched::SchedMetrics metrics;
  explicit Impl(const sched::SlaConfig& sla) : metrics(sla) {}
  // Online fit of the step cost model (sched/step_cost_fit.h); feeds the SLA policy's
  // step budget.
  sched::StepCostFit cost_fit;
  // --step-trace: one line per step (what the cost model is fitted from).
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> step_trace{nullptr, &std::fclose};
  std::unique_ptr<ThreadPool> pool;
  model::Workspace ws;
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

  // Engine-thread state.
  std::unordered_map<uint64_t, std::unique_ptr<ActiveRequest>> active;
  std::unordered_map<uint64_t, Choice*> by_seq;  // sequence id -> choice
  uint64_t next_seq_id = 1;
  model::Batch batch;
  std::vector<std::span<const kv::BlockId>> tables;

  mutable std::mutex stats_mu;
  EngineStats stats;

  void loop();
  void admit(std::unique_ptr<ActiveRequest> r);
  void step();
  void handle_token(Choice& c, std::span<const float> logits);
  void fork_children(ActiveRequest& r, std::span<const float> logits);
  void finish_choice(Choice& c, FinishReason reason, const std::string& message = {});
  void emit_delta(Choice& c, std::string text, std::vector<TokenInfo> tokens);
  void finish_embedding(Choice& c);
  void abort_request(ActiveRequest& r, const std::string& message);
  void maybe_complete(ActiveRequest& r);
  void reap();
  std::vector<uint64_t> completed_ids;
  void publish_stats(double step_ms, int batch_tokens, int batch_seqs);
  void refresh_gauges_locked();
  void observe_cost(const StepReport& rep);
};

Engine::Engine(std::shared_ptr<const model::Model> model, tokenizer::Tokenizer tokenizer,
               const EngineConfig& cfg)
    : model_(std::move(model)), tokenizer_(std::move(tokenizer)), cfg_(cfg) {}

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
  if (tokenizer.n_vocab() != static_cast<int32_t>(hp.n_vocab)) {
    // Models may pad the embedding beyond the vocabulary; ids beyond it are never produced.
    if (tokenizer.n_vocab() > static_cast<int32_t>(hp.n_vocab)) {
      return invalid_argument("the tokenizer has more tokens than the model's embedding");
    }
  }
  auto e = std::unique_ptr<Engine>(new Engine(std::move(model), std::move(tokenizer), cfg));
  auto impl = std::make_unique<Impl>(cfg.sla);
  impl->self = e.get();
  e->n_ctx_ = cfg.n_ctx > 0 ? std::min<int>(cfg.n_ctx, static_cast<int>(hp.n_ctx_train))
                            : static_cast<int>(hp.n_ctx_train);

  impl->layout.type = cfg.kv_type;
  impl->layout.block_size = cfg.kv_block;
  impl->layout.n_head_kv = static_cast<int>(hp.n_head_kv);
  impl->layout.head_dim = static_cast<int>(hp.head_dim);
  const size_t block_bytes = kv::KvArena::block_bytes(hp, impl->layout);
  int64_t n_blocks;
  if (cfg.kv_memory_bytes > 0) {
    n_blocks = cfg.kv_memory_bytes / static_cast<int64_t>(block_bytes);
  } else {
    const int tokens = cfg.ctx_total > 0 ? cfg.ctx_total : 64 * 1024;
    n_blocks = (tokens + cfg.kv_block - 1) / cfg.kv_block;
  }
  if (n_blocks < 1) return invalid_argument("the KV budget holds less than one block");
  if (n_blocks > (1 << 24)) return invalid_argument("the KV budget is too large");
  impl->arena = std::make_unique<kv::KvArena>(hp, impl->layout, static_cast<int32_t>(n_blocks));
  impl->kv = std::make_unique<kv::KvCacheManager>(kv::KvCacheConfig{
      static_cast<int32_t>(n_blocks), cfg.kv_block, cfg.prefix_cache, cfg.model_variant});
  impl->prefix_hint = impl->kv->prefix_hint();
  if (!cfg.step_trace.empty()) {
    impl->step_trace.reset(std::fopen(cfg.step_trace.c_str(), "w"));
    if (!impl->step_trace) return invalid_argument("--step-trace: cannot write '" + cfg.step_trace + "'");
    std::fputs("# step_s prefill_tokens decode_seqs prefill_pairs decode_keys logit_rows attention_s\n",
               impl->step_trace.get());
  }
  sched::SlaSchedulerConfig sc;
  sc.base.max_batch_tokens = cfg.max_batch_tokens;
  sc.base.max_seqs = cfg.max_seqs;
  sc.base.max_logits = cfg.max_seqs;
  sc.sla = cfg.sla;
  sc.tpot_slack = cfg.tpot_slack;
  sc.tpot_cap_own_class = cfg.tpot_cap_own_class;
  if (cfg.decode_share > 0.0) sc.decode_share = cfg.decode_share;
  sc.metrics = &impl->metrics;
  METRO_ASSIGN_OR_RETURN(impl->sched, sched::make_scheduler(cfg.sched, sc, *impl->kv));
  impl->sla = dynamic_cast<sched::SlaScheduler*>(impl->sched.get());
  const int threads = cfg.n_threads > 0 ? cfg.n_threads : cpu_features().physical_cores;
  impl->pool = std::make_unique<ThreadPool>(threads);
  model::WorkspaceLimits lim;
  lim.max_tokens = cfg.max_batch_tokens;
  lim.max_logits = cfg.max_seqs;
  lim.max_seqs = cfg.max_seqs;
  lim.max_blocks_per_seq = (e->n_ctx_ + cfg.kv_block - 1) / cfg.kv_block + 1;
  impl->ws = e->model_->make_workspace(lim);
  impl->stats.kv_blocks_total = static_cast<int32_t>(n_blocks);
  impl->stats.step_ms_buckets.assign(EngineStats::step_ms_bounds().size() + 1, 0);
  impl->stats.batch_tokens_buckets.assign(EngineStats::batch_tokens_bounds().size() + 1, 0);
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
  if (impl_->thread.joinable()) impl_->thread.join();
}

int64_t Engine::kv_capacity_tokens() const {
  return static_cast<int64_t>(impl_->arena->n_blocks()) * cfg_.kv_block;
}
size_t Engine::kv_bytes() const { return impl_->arena->bytes(); }
int Engine::cached_prefix_tokens(std::span<const int32_t> prompt, bool with_pending) const {
  const auto& hint = impl_->prefix_hint;
  return hint ? hint->cached_tokens(prompt, with_pending) : 0;
}
std::shared_ptr<const void> Engine::hold_pending_prefix(std::span<const int32_t> prompt) const {
  const auto& hint = impl_->prefix_hint;
  return hint ? hint->hold_pending(prompt) : nullptr;
}
size_t Engine::workspace_bytes() const { return impl_->ws.bytes(); }
const char* Engine::scheduler_name() const { return impl_->sched->name(); }
const sched::SchedMetrics& Engine::sched_metrics() const { return impl_->metrics; }
sched::SchedMetrics& Engine::sched_metrics() { return impl_->metrics; }

Status Engine::validate(Request& r) const {
  const int32_t n_vocab = tokenizer_.n_vocab();
  if (r.prompt.empty()) return invalid_argument("the prompt is empty");
  for (int32_t id : r.prompt) {
    if (id < 0 || id >= n_vocab) {
      return invalid_argument("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(n_vocab) + ")");
    }
  }
  if (r.n < 1 || r.n > cfg_.max_n) {
    return invalid_argument("n must be in [1, " + std::to_string(cfg_.max_n) + "]");
  }
  const int64_t prompt = static_cast<int64_t>(r.prompt.size());
  if (r.kind == RequestKind::kGenerate) {
    if (r.stop.max_tokens < 1) return invalid_argument("max_tokens must be at least 1");
    METRO_RETURN_IF_ERROR(r.sampling.validate(n_vocab));
    for (int32_t id : r.stop.stop_token_ids) {
      if (id < 0 || id >= n_vocab) return invalid_argument("stop token id outside the vocabulary");
    }
  } else {
    r.n = 1;
    r.stop.max_tokens = 0;
  }
  const int64_t need = prompt + r.stop.max_tokens;
  if (need > n_ctx_) {
    return out_of_range("this model's context is " + std::to_string(n_ctx_) + " tokens; the request has " +
                        std::to_string(prompt) + " prompt tokens and max_tokens " +
                        std::to_string(r.stop.max_tokens) + " (" + std::to_string(need) + " in all)");
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
    if (Status s = validate(r); !s.ok()) {
      out.emplace_back(std::move(s));
      continue;
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

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->stats_mu);
  return impl_->stats;
}

// ---------------------------------------------------------------------------------------
// Engine thread

void Engine::Impl::loop() {
  for (;;) {
    std::vector<std::unique_ptr<ActiveRequest>> fresh;
    std::vector<uint64_t> aborts;
    bool stop_now = false;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return stopping || !intake.empty() || !abort_ids.empty() || !active.empty(); });
      fresh.swap(intake);
      aborts.swap(abort_ids);
      stop_now = stopping;
    }
    for (auto& r : fresh) admit(std::move(r));
    for (uint64_t id : aborts) {
      auto it = active.find(id);
      if (it != active.end()) abort_request(*it->second, "aborted");
    }
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
  const tokenizer::DecodeOptions dopts{.render_special = false, .strip_leading_space = false};
  for (int i = 0; i < q.n; ++i) {
    auto c = std::make_unique<Choice>();
    c->req = r.get();
    c->index = i;
    c->seq.id = next_seq_id++;
    c->seq.tokens = q.prompt;
    c->seq.n_prompt = static_cast<int>(q.prompt.size());
    c->seq.max_new_tokens = q.stop.max_tokens;
    c->seq.arrival_ns = now_ns();
    c->seq.sla_class = q.sla_class;
    c->seq.tenant = q.tenant;
    c->seq.deadline_ns = q.deadline_ns;
    c->seq.prefix_hash = q.prefix_hash;
    c->seq.use_prefix_cache = q.kind == RequestKind::kGenerate;
    if (q.kind == RequestKind::kGenerate) {
      c->sampler = std::make_unique<Sampler>(q.sampling, base_seed + static_cast<uint64_t>(i));
      c->history.set_prompt(q.prompt);
      c->detok = std::make_unique<tokenizer::IncrementalDetokenizer>(self->tokenizer_, dopts);
      c->stop = std::make_unique<StopMatcher>(q.stop.stop);
    }
    by_seq[c->seq.id] = c.get();
    r->choices.push_back(std::move(c));
  }
  r->usage.prompt_tokens = static_cast<int>(q.prompt.size());
  r->arrival_ns = q.arrival_ns > 0 ? q.arrival_ns : now_ns();
  for (auto& c : r->choices) c->seq.arrival_ns = r->arrival_ns;
  r->children_pending = q.n > 1;
  Choice& first = *r->choices[0];
  first.in_scheduler = true;
  sched->add(&first.seq);
  const uint64_t id = r->id;
  active.emplace(id, std::move(r));
}

void Engine::Impl::step() {
  const int64_t t0 = now_ns();
  sched::StepPlan plan = sched->schedule(t0);
  if (plan.empty()) {
    // Nothing fits right now (should not happen: submit() refuses what can never fit).
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return;
  }
  batch.clear();
  tables.clear();
  bool want_hidden = false;
  for (size_t slot = 0; slot < plan.seqs.size(); ++slot) {
    const sched::ScheduledSeq& ss = plan.seqs[slot];
    Choice& c = *by_seq.at(ss.seq->id);
    const bool embed = c.req->req.kind == RequestKind::kEmbed;
    want_hidden = want_hidden || embed;
    tables.push_back(kv->table(ss.seq->id));
    const int begin = ss.seq->n_computed, end = begin + ss.n_tokens;
    for (int p = begin; p < end; ++p) {
      batch.add(ss.seq->tokens[static_cast<size_t>(p)], p, static_cast<int32_t>(slot),
                !embed && p == end - 1 && ss.samples());
    }
  }
  model::KvView view = arena->view(tables);
  model::ForwardOptions fo;
  fo.want_hidden = want_hidden;
  auto out = self->model_->forward(batch, view, ws, *pool, fo);
  if (!out.ok()) {
    METRO_LOG_ERROR("engine step failed: %s", out.status().to_string().c_str());
    for (const auto& ss : plan.seqs) {
      Choice& c = *by_seq.at(ss.seq->id);
      abort_request(*c.req, "internal error: " + out.status().message());
    }
    return;
  }
  // Which planned sequences sample, before update() moves their computed counts.
  std::vector<uint8_t> samples(plan.seqs.size());
  for (size_t i = 0; i < plan.seqs.size(); ++i) samples[i] = plan.seqs[i].samples() ? 1 : 0;
  sched->update(plan);

  uint64_t prompt_tokens = 0;
  int row = 0, tok = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const sched::ScheduledSeq& ss = plan.seqs[i];
    Choice& c = *by_seq.at(ss.seq->id);
    ActiveRequest& r = *c.req;
    const int start_tok = tok;
    tok += ss.n_tokens;
    const int prompt_end = ss.seq->n_prompt;
    const int chunk_begin = ss.seq->n_computed - ss.n_tokens;
    prompt_tokens += static_cast<uint64_t>(std::max(0, std::min(prompt_end, ss.seq->n_computed) - chunk_begin));
    if (r.req.kind == RequestKind::kEmbed) {
      if (r.aborting || c.finished) continue;
      const int n_embd = static_cast<int>(self->model_->hparams().n_embd);
      if (r.embed_sum.empty()) r.embed_sum.assign(static_cast<size_t>(n_embd), 0.0);
      for (int t = start_tok; t < start_tok + ss.n_tokens; ++t) {
        const float* h = out->hidden + static_cast<size_t>(t) * static_cast<size_t>(n_embd);
        for (int d = 0; d < n_embd; ++d) r.embed_sum[static_cast<size_t>(d)] += h[d];
      }
      r.embed_rows += ss.n_tokens;
      if (samples[i]) finish_embedding(c);
      continue;
    }
    if (!samples[i]) continue;
    const std::span<const float> logits = out->row(row++);
    if (r.aborting || c.finished) continue;
    if (c.index == 0 && r.children_pending) fork_children(r, logits);
    handle_token(c, logits);
  }
  const double step_ms = static_cast<double>(now_ns() - t0) * 1e-6;
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    stats.prompt_tokens += prompt_tokens;
  }
  StepReport rep;
  rep.step_s = step_ms * 1e-3;
  rep.logit_rows = out->n_rows;
  rep.attention_s = out->attention_s;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const sched::ScheduledSeq& ss = plan.seqs[i];
    const int chunk_begin = ss.seq->n_computed - ss.n_tokens;
    const int prompt_part = std::max(0, std::min(ss.seq->n_prompt, ss.seq->n_computed) - chunk_begin);
    if (ss.n_tokens == 1 && chunk_begin >= ss.seq->n_prompt) {
      ++rep.decode_seqs;
      rep.decode_ctx += static_cast<double>(chunk_begin + 1);
    } else {
      rep.prefill_tokens += ss.n_tokens;
      rep.prefill_pairs += sched::StepCostModel::pairs(ss.n_tokens, chunk_begin);
      rep.prefill_tokens_by_class[static_cast<size_t>(ss.seq->sla_class)] += prompt_part;
    }
  }
  const auto counts = sched->counts();
  rep.waiting_by_class = counts.waiting_by_class;
  rep.running_by_class = counts.running_by_class;
  for (int k = 0; k < sched::kNumSlaClasses; ++k) {
    metrics.set_queue_depth(static_cast<sched::SlaClass>(k), counts.waiting_by_class[static_cast<size_t>(k)],
                            counts.running_by_class[static_cast<size_t>(k)]);
  }
  observe_cost(rep);
  if (self->cfg_.on_step) self->cfg_.on_step(rep);
  publish_stats(step_ms, plan.n_tokens, static_cast<int>(plan.seqs.size()));
}

void Engine::Impl::fork_children(ActiveRequest& r, std::span<const float> logits) {
  r.children_pending = false;
  Choice& parent = *r.choices[0];
  for (size_t k = 1; k < r.choices.size(); ++k) {
    // An earlier child's first token can abort the request (its client stopped reading):
    // the parent's blocks are gone then, and a fork now would leak the copy's blocks.
    if (r.aborting) break;
    Choice& child = *r.choices[k];
    if (child.finished) continue;
    auto copy = kv->fork(parent.seq.id, child.seq.id, parent.seq.n_computed);
    child.in_scheduler = true;
    if (!copy) {  // no block for the partial copy: compute the prompt like a new request
      sched->add(&child.seq);
      continue;
    }
    if (*copy) arena->copy_block((*copy)->src, (*copy)->dst);
    child.seq.n_computed = parent.seq.n_computed;
    child.seq.n_cached_prompt = parent.seq.n_cached_prompt;
    handle_token(child, logits);
    if (!child.finished) sched->add_running(&child.seq);
  }
}

void Engine::Impl::handle_token(Choice& c, std::span<const float> logits) {
  ActiveRequest& r = *c.req;
  const Request& q = r.req;
  SampleResult s = c.sampler->sample(logits, c.history, scratch);
  c.seq.tokens.push_back(s.token);
  c.history.add_generated(s.token);
  r.usage.completion_tokens += 1;
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    stats.generated_tokens += 1;
  }
  TokenInfo info{s.token, s.logprob, std::move(s.top)};

  const bool eog = !q.stop.ignore_eos && self->tokenizer_.is_eog(s.token);
  const bool stop_tok = std::find(q.stop.stop_token_ids.begin(), q.stop.stop_token_ids.end(), s.token) !=
                        q.stop.stop_token_ids.end();
  if (eog || stop_tok) {
    // The stop token itself is not text the user sees; release what the matcher held.
    std::string tail = c.detok->flush();
    bool matched = false;
    std::string text = c.stop->push(tail, &matched);
    if (!matched) text += c.stop->flush();
    emit_delta(c, std::move(text), {info});
    finish_choice(c, FinishReason::kStop);
    return;
  }
  bool matched = false;
  std::string text = c.stop->push(c.detok->push(s.token), &matched);
  if (matched) {
    emit_delta(c, std::move(text), {info});
    finish_choice(c, FinishReason::kStop);
    return;
  }
  const bool length = c.seq.n_generated() >= q.stop.max_tokens ||
                      static_cast<int>(c.seq.tokens.size()) >= self->n_ctx_;
  if (length) {
    std::string tail = c.detok->flush();
    bool m2 = false;
    text += c.stop->push(tail, &m2);
    if (!m2) text += c.stop->flush();
    emit_delta(c, std::move(text), {info});
    finish_choice(c, m2 ? FinishReason::kStop : FinishReason::kLength);
    return;
  }
  emit_delta(c, std::move(text), {info});
}

void Engine::Impl::emit_delta(Choice& c, std::string text, std::vector<TokenInfo> tokens) {
  if (c.finished || c.req->aborting) return;
  const int64_t t = now_ns();
  ActiveRequest& r = *c.req;
  if (r.first_token_ns == 0) {
    r.first_token_ns = t;
    metrics.observe_first_token(r.req.sla_class, static_cast<double>(t - r.arrival_ns) * 1e-9);
  }
  r.last_token_ns = t;
  Event e;
  e.kind = Event::Kind::kDelta;
  e.index = c.index;
  e.text = std::move(text);
  e.tokens = std::move(tokens);
  e.time_ns = now_ns();
  if (!c.req->stream->push(std::move(e))) {
    abort_request(*c.req, "the client is not reading its stream");
  }
}

void Engine::Impl::finish_choice(Choice& c, FinishReason reason, const std::string& message) {
  if (c.finished) return;
  ActiveRequest& r = *c.req;
  c.finished = true;
  if (c.in_scheduler) {
    if (reason == FinishReason::kStop || reason == FinishReason::kLength) {
      sched->finish(&c.seq);
    } else {
      sched->remove(&c.seq);
    }
  }
  c.in_scheduler = false;
  if (c.index == 0 && r.children_pending) {
    // Children never started (the parent ended before its prompt finished): end them too.
    r.children_pending = false;
    for (size_t k = 1; k < r.choices.size(); ++k) finish_choice(*r.choices[k], reason, message);
  }
  Event e;
  e.kind = Event::Kind::kFinish;
  e.index = c.index;
  e.reason = reason;
  e.message = message;
  e.time_ns = now_ns();
  if (!r.stream->push(std::move(e)) && !r.aborting) {
    abort_request(r, "the client is not reading its stream");
    return;
  }
  ++r.n_finished;
  maybe_complete(r);
}

void Engine::Impl::finish_embedding(Choice& c) {
  ActiveRequest& r = *c.req;
  Event e;
  e.kind = Event::Kind::kEmbedding;
  e.index = 0;
  double norm = 0.0;
  e.embedding.resize(r.embed_sum.size());
  for (size_t d = 0; d < r.embed_sum.size(); ++d) {
    const double m = r.embed_sum[d] / std::max(1, r.embed_rows);
    e.embedding[d] = static_cast<float>(m);
    norm += m * m;
  }
  norm = std::sqrt(norm);
  if (norm > 0) {
    for (float& v : e.embedding) v = static_cast<float>(v / norm);
  }
  e.time_ns = now_ns();
  r.stream->push(std::move(e));
  finish_choice(c, FinishReason::kStop);
}

void Engine::Impl::abort_request(ActiveRequest& r, const std::string& message) {
  if (r.aborting) return;
  r.aborting = true;
  r.children_pending = false;
  for (auto& c : r.choices) {
    if (c->in_scheduler) sched->remove(&c->seq);
    c->in_scheduler = false;
    if (!c->finished) {
      c->finished = true;
      ++r.n_finished;
      Event e;
      e.kind = Event::Kind::kFinish;
      e.index = c->index;
      e.reason = FinishReason::kAbort;
      e.message = message;
      e.time_ns = now_ns();
      r.stream->push(std::move(e));
    }
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    stats.requests_aborted += 1;
  }
  maybe_complete(r);
}

void Engine::Impl::maybe_complete(ActiveRequest& r) {
  if (r.completed || r.n_finished < static_cast<int>(r.choices.size())) return;
  r.usage.cached_prompt_tokens = r.choices[0]->seq.n_cached_prompt;
  const int64_t end_ns = now_ns();
  // Counters and metrics first, then the final event: a client that reads stats() after its
  // stream ends must see its own request counted and its blocks back in the pool.
  if (!r.aborting && r.req.kind == RequestKind::kGenerate && r.first_token_ns > 0) {
    const double ttft = static_cast<double>(r.first_token_ns - r.arrival_ns) * 1e-9;
    const double e2e = static_cast<double>(end_ns - r.arrival_ns) * 1e-9;
    const int per_choice = r.usage.completion_tokens / std::max(1, static_cast<int>(r.choices.size()));
    const double tpot = per_choice > 1 ? static_cast<double>(r.last_token_ns - r.first_token_ns) * 1e-9 /
                                             (per_choice - 1)
                                       : -1.0;
    metrics.observe_finished(r.req.sla_class, ttft, tpot, e2e);
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    if (!r.aborting) stats.requests_finished += 1;
    refresh_gauges_locked();
  }
  Event e;
  e.kind = Event::Kind::kDone;
  e.usage = r.usage;
  e.time_ns = end_ns;
  r.stream->push_final(std::move(e));
  r.completed = true;
  completed_ids.push_back(r.id);
}

void Engine::Impl::reap() {
  for (uint64_t id : completed_ids) {
    auto it = active.find(id);
    if (it == active.end()) continue;
    for (auto& c : it->second->choices) by_seq.erase(c->seq.id);
    active.erase(it);
  }
  completed_ids.clear();
}

void Engine::Impl::observe_cost(const StepReport& rep) {
  if (step_trace) {
    std::fprintf(step_trace.get(), "%.6f %d %d %.0f %.0f %d %.6f\n", rep.step_s, rep.prefill_tokens,
                 rep.decode_seqs, rep.prefill_pairs, rep.decode_ctx, rep.logit_rows, rep.attention_s);
    if (cost_fit.steps() % 64 == 0) std::fflush(step_trace.get());
  }
  cost_fit.observe(rep.step_s, rep.prefill_tokens, rep.decode_seqs, rep.prefill_pairs, rep.decode_ctx);
  // Every step until the terms can be told apart (the first steps after start are timed
  // too), then every 32. Fitted under every policy: the SLA policy cuts its steps with it,
  // and /metrics shows it whichever runs (what a load's capacity is computed from,
  // bench/sla_scenarios.py --capacity-def model).
  if (cost_fit.steps() > sched::StepCostFit::kMinStepsForTerms && cost_fit.steps() % 32 != 0) return;
  const std::optional<sched::StepCostModel> cost = cost_fit.fit();
  if (!cost) return;
  if (sla) sla->set_step_cost(*cost);
  std::lock_guard<std::mutex> lock(stats_mu);
  stats.cost_fixed_s = cost->fixed_s;
  stats.cost_per_prefill_token_s = cost->per_prefill_token_s;
  stats.cost_per_decode_seq_s = cost->per_decode_seq_s;
  stats.cost_per_attention_pair_s = cost->per_attention_pair_s;
  stats.cost_per_decode_ctx_s = cost->per_decode_ctx_s;
}

// Queue and KV gauges from the scheduler and the KV manager (engine thread; stats_mu held).
void Engine::Impl::refresh_gauges_locked() {
  const auto counts = sched->counts();
  const auto ks = kv->stats();
  stats.waiting = counts.waiting;
  stats.running = counts.running;
  stats.preemptions = counts.preemptions;
  stats.kv_blocks_used = ks.blocks_used;
  stats.kv_blocks_cached = ks.blocks_cached;
  stats.prefix_queries = ks.prefix_queries;
  stats.prefix_hits = ks.prefix_hits;
}

void Engine::Impl::publish_stats(double step_ms, int batch_tokens, int batch_seqs) {
  std::lock_guard<std::mutex> lock(stats_mu);
  refresh_gauges_locked();
  stats.steps += 1;
  stats.step_seconds_total += step_ms * 1e-3;
  stats.last_step_ms = step_ms;
  stats.last_batch_tokens = batch_tokens;
  stats.last_batch_seqs = batch_seqs;
  stats.step_budget_tokens = sla != nullptr ? sla->last_step_budget() : self->cfg_.max_batch_tokens;
  observe(stats.step_ms_buckets, EngineStats::step_ms_bounds(), step_ms);
  observe(stats.batch_tokens_buckets, EngineStats::batch_tokens_bounds(), batch_tokens);
}

}  // namespace metro::engine
