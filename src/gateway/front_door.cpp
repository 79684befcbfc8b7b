#include "gateway/front_door.h"

#include <algorithm>
#include <chrono>

#include "base/clock.h"
#include "base/log.h"

namespace metro::gateway {

Status validate(const FrontDoorConfig& cfg) {
  METRO_RETURN_IF_ERROR(validate(cfg.admission_cfg));
  METRO_RETURN_IF_ERROR(validate(cfg.default_quota));
  for (const auto& [name, q] : cfg.tenant_quotas) {
    if (Status s = validate(q); !s.ok()) return invalid_argument("tenant '" + name + "': " + s.message());
  }
  if (cfg.max_inflight_choices < 1) return invalid_argument("max_inflight_choices must be >= 1");
  if (cfg.embed_window) METRO_RETURN_IF_ERROR(validate(*cfg.embed_window));
  return Status();
}

namespace {

// Prompt tokens the engine will compute: at least one (the last token always is).
int uncached(int prompt_tokens, int cached_tokens) {
  return std::max(std::min(prompt_tokens, 1), prompt_tokens - std::max(0, cached_tokens));
}

// Feeds a model's admission control with what each of its engine's steps measured.
class AdmissionFeed final : public engine::StepObserver {
 public:
  explicit AdmissionFeed(std::shared_ptr<AdmissionController> admission) : admission_(std::move(admission)) {}
  void on_step(const engine::StepReport& rep) override {
    StepObservation o;
    o.step_s = rep.cost.step_s;
    o.prefill_tokens = rep.prefill_tokens_by_class;
    const int all = rep.cost.prefill_tokens + rep.cost.decode_seqs;
    o.prefill_s = all > 0 ? rep.cost.step_s * rep.cost.prefill_tokens / all : 0.0;
    for (size_t c = 0; c < o.backlogged.size(); ++c) {
      // A class had prompts waiting when the step began if it got prompt tokens in it or
      // still has prompts waiting after it.
      o.backlogged[c] = rep.prefill_tokens_by_class[c] > 0 || rep.waiting_by_class[c] > 0;
    }
    o.output_tokens = rep.output_tokens_by_class;
    o.begun = rep.begun_by_class;
    o.ttft_margin_cap = rep.admission_ttft_margin_cap;
    admission_->observe_step(o);
  }

 private:
  std::shared_ptr<AdmissionController> admission_;
};

}  // namespace

// ---------------------------------------------------------------------------------------
// Call

Call::Call(FrontDoor* door, const CallRequest& r, int uncached_prompt_tokens, int64_t admitted_ns)
    : door_(door),
      model_(r.model),
      tenant_(r.tenant),
      sla_class_(r.sla_class),
      uncached_prompt_tokens_(uncached_prompt_tokens),
      charge_tokens_(static_cast<int64_t>(r.prompt_tokens) + static_cast<int64_t>(r.max_tokens) * r.n_choices),
      n_choices_(r.n_choices),
      start_ns_(admitted_ns) {
  embeddings_ = !r.requests.empty() && r.requests.front().kind == engine::RequestKind::kEmbed;
}

Call::~Call() { finish(CallOutcome{}); }

void Call::submit(std::vector<engine::Request> requests, Submitted done) {
  std::shared_ptr<engine::Engine> eng = model_->engine;
  for (engine::Request& r : requests) r.adapter = model_->adapter;
  // Admission's promise, kept or ended: past it without a first token the engine ends the
  // request with 503 deadline_missed instead of leaving the client waiting.
  if (model_->admission) {
    for (engine::Request& r : requests) {
      r.deadline_ns = model_->admission->shed_deadline_ns(sla_class_, start_ns_, r.deadline_ns);
      r.max_stall_ns = model_->admission->max_stall_ns(sla_class_);
    }
  }
  EmbedBatcher* window = embeddings_ ? door_->embed_window() : nullptr;
  if (window == nullptr) {
    std::vector<engine::Handle> handles;
    for (engine::Request& r : requests) {
      auto h = eng->submit(std::move(r));
      if (!h.ok()) {
        for (const engine::Handle& prev : handles) eng->abort(prev.id);
        done(h.status());
        return;
      }
      handles.push_back(std::move(*h));
    }
    {
      std::lock_guard lock(mu_);
      for (const engine::Handle& h : handles) engine_ids_.push_back(h.id);
    }
    done(std::move(handles));
    return;
  }
  // What the engine would refuse is refused now, not after the wait.
  for (const engine::Request& r : requests) {
    if (Status s = eng->check(r); !s.ok()) {
      done(s);
      return;
    }
  }
  int n_tokens = 0;
  for (const engine::Request& r : requests) n_tokens += static_cast<int>(r.prompt.size());
  std::weak_ptr<Call> weak = weak_from_this();
  auto on_batch = [weak, eng, done = std::move(done)](std::vector<Expected<engine::Handle>> hs) {
    auto abort_all = [&] {
      for (const auto& h : hs) {
        if (h.ok()) eng->abort(h->id);
      }
    };
    std::shared_ptr<Call> self = weak.lock();
    if (!self) {  // the request ended while held
      abort_all();
      return;
    }
    std::vector<engine::Handle> handles;
    Status refused;
    for (auto& h : hs) {
      if (!h.ok()) {
        if (refused.ok()) refused = h.status();
        continue;
      }
      handles.push_back(std::move(*h));
    }
    {
      std::lock_guard lock(self->mu_);
      self->window_ticket_ = 0;
      if (self->ended_ || !refused.ok()) {
        abort_all();
        if (self->ended_) return;
      } else {
        for (const engine::Handle& h : handles) self->engine_ids_.push_back(h.id);
      }
    }
    if (!refused.ok()) {
      done(refused);
    } else {
      done(std::move(handles));
    }
  };
  auto submit_all = [eng](std::vector<engine::Request> rs) { return eng->submit_all(std::move(rs)); };
  std::lock_guard lock(mu_);
  window_ticket_ = window->hold(reinterpret_cast<uintptr_t>(eng.get()), sla_class_, n_tokens, std::move(submit_all), std::move(requests),
                                std::move(on_batch));
}

void Call::first_token() {
  if (!queued_) return;
  queued_ = false;
  if (model_->admission) model_->admission->release(sla_class_, uncached_prompt_tokens_, tenant_, start_ns_);
  pending_prefixes_.clear();
}

void Call::finish(const CallOutcome& outcome) {
  if (finished_) return;
  finished_ = true;
  first_token();
  std::vector<uint64_t> ids;
  uint64_t ticket = 0;
  {
    std::lock_guard lock(mu_);
    ended_ = true;
    ticket = window_ticket_;
    window_ticket_ = 0;
    if (!outcome.completed) ids.swap(engine_ids_);
  }
  if (ticket != 0 && door_->embed_window() != nullptr) door_->embed_window()->cancel(ticket);
  for (uint64_t id : ids) model_->engine->abort(id);
  door_->inflight_choices_.fetch_sub(n_choices_);
  const int64_t now = now_ns();
  const int64_t used = static_cast<int64_t>(outcome.prompt_tokens) + outcome.completion_tokens;
  door_->quota_.release(tenant_, charge_tokens_, used, static_cast<double>(now - start_ns_) * 1e-9, now);
}

// ---------------------------------------------------------------------------------------
// FrontDoor

FrontDoor::FrontDoor(const FrontDoorConfig& cfg, std::shared_ptr<metrics::Registry> registry)
    : cfg_(cfg),
      metrics_(registry ? std::move(registry) : std::make_shared<metrics::Registry>()),
      quota_(cfg.default_quota) {
  METRO_CHECK_MSG(validate(cfg_).ok(), "FrontDoor: invalid config (call validate())");
  cfg_.admission_cfg.sla = cfg_.sla;
  for (const auto& [name, q] : cfg_.tenant_quotas) quota_.set_quota(name, q);
  if (cfg_.embed_window) window_ = std::make_shared<EmbedBatcher>(*cfg_.embed_window, cfg_.sla);
  own_metrics_ = metrics_->add([this](metrics::Exposition& e) {
    const char* help = "Requests refused, by model, SLA class and reason.";
    e.declare("metro_class_rejections_total", metrics::Type::kCounter, help);
    {
      std::lock_guard lock(refusals_mu_);
      for (const auto& [key, n] : refusals_) {
        const auto& [model, cls, reason] = key;
        e.counter("metro_class_rejections_total", help,
                  metrics::labels({{"model", model}, {"class", sla_class_name(static_cast<SlaClass>(cls))},
                                   {"reason", reason}}),
                  static_cast<double>(n));
      }
    }
    e.gauge("metro_inflight_choices", "Choices of admitted requests not yet finished.", "",
            static_cast<double>(inflight_choices_.load()));
    e.gauge("metro_model_loaded", "1 once a model is loaded and requests are served.", "",
            registry_.empty() ? 0.0 : 1.0);
    guard_.export_metrics(e);
    const char* share_help = "Share of a model name's requests its variant gets (0 to 1).";
    e.declare("metro_variant_share", metrics::Type::kGauge, share_help);  // declared with no split too
    for (const auto& [key, share] : registry_.splits()) {
      e.gauge("metro_variant_share", share_help, metrics::labels({{"model", key.first}, {"variant", key.second}}),
              share);
    }
    if (window_) {
      const EmbedBatcherStats s = window_->stats();
      e.counter("metro_embed_window_held_total", "Embedding requests that entered the batching window.", "",
                static_cast<double>(s.held));
      e.counter("metro_embed_window_batches_total", "Batches the window submitted to the engine.", "",
                static_cast<double>(s.batches));
      e.counter("metro_embed_window_submitted_total", "Embedding inputs submitted in those batches.", "",
                static_cast<double>(s.submitted));
      e.counter("metro_embed_window_cancelled_total", "Held requests whose client left before submission.", "",
                static_cast<double>(s.cancelled));
      e.gauge("metro_embed_window_waiting", "Requests in the window now.", "", static_cast<double>(s.waiting));
      for (int c = 0; c < kNumSlaClasses; ++c) {
        const auto cls = static_cast<SlaClass>(c);
        e.gauge("metro_embed_window_max_wait_seconds", "Longest an embedding request of a class waits for its batch.",
                metrics::labels({{"class", sla_class_name(cls)}}), window_->max_wait_s(cls));
      }
    }
  });
}

FrontDoor::~FrontDoor() {
  own_metrics_ = metrics::Registration();
  shutdown();
}

void FrontDoor::shutdown() {
  if (window_) window_->stop();
  registry_.clear();
}

Status FrontDoor::add_model(std::shared_ptr<ServedModel> model) {
  if (!model || !model->engine) return invalid_argument("add_model: no engine");
  engine::Engine& eng = *model->engine;
  const bool admission = cfg_.admission == AdmissionMode::kOn ||
                         (cfg_.admission == AdmissionMode::kAuto && eng.queue_order()->by_class());
  if (admission) model->admission = std::make_shared<AdmissionController>(cfg_.admission_cfg, eng.queue_order());
  if (!model->grammars) model->grammars = std::make_shared<grammar::GrammarCache>(eng.tokenizer());
  if (cfg_.calibrate) {
    // One timed prefill: admission starts from this machine's real speed, and the weights
    // are paged in before the first client.
    METRO_ASSIGN_OR_RETURN(auto rate, measure_prefill(eng));
    model->calibrated_prefill_tokens_per_s = rate.first;
    if (model->admission) model->admission->calibrate(rate.first, rate.second);
  }
  if (model->admission) eng.add_observer(std::make_shared<AdmissionFeed>(model->admission));
  model->metrics_label = std::make_shared<metrics::SharedLabel>(model->id());
  model->engine_metrics = std::make_shared<metrics::Registration>(eng.export_metrics(*metrics_, model->metrics_label));
  return registry_.add(std::move(model));
}

Status FrontDoor::add_adapter(const std::string& name, const std::shared_ptr<const ServedModel>& base,
                              int16_t adapter) {
  if (!base || !base->engine) return invalid_argument("add_adapter: no base model");
  if (adapter < 1 || adapter > base->engine->model().n_adapters()) {
    return invalid_argument("add_adapter: the model has no LoRA adapter " + std::to_string(adapter));
  }
  auto m = std::make_shared<ServedModel>(*base);
  m->name = name;
  m->aliases.clear();
  m->variant.clear();
  m->adapter = adapter;
  return registry_.add(std::move(m));
}

Status FrontDoor::remove_model(const std::string& name, const std::string& variant) {
  METRO_RETURN_IF_ERROR(registry_.remove(name, variant));
  guard_.forget(name, variant);
  return Status();
}

std::shared_ptr<const ServedModel> FrontDoor::resolve(const std::string& name, std::string_view sticky_key) const {
  return registry_.pick(name, sticky_key);
}

void FrontDoor::count_refusal(const std::string& model, SlaClass c, const std::string& reason) {
  std::lock_guard lock(refusals_mu_);
  ++refusals_[{model, static_cast<int>(c), reason}];
}

std::string FrontDoor::message_for(const Decision& d, SlaClass c) const {
  const std::string retry = std::to_string(static_cast<int>(d.retry_after_s));
  if (d.reason == kReasonTenantRate) {
    return "your key is over its tokens-per-minute quota; retry after " + retry + " s";
  }
  if (d.reason == kReasonTenantConcurrency) {
    return "your key has as many requests in flight as its quota allows; retry after " + retry + " s";
  }
  if (d.reason == kReasonDeadline) return "the request cannot start before its deadline (metro_deadline_ms)";
  if (d.reason == kReasonTtft) {
    return std::string("the ") + sla_class_name(c) +
           " queue is too long to start this request within its time-to-first-token objective; retry after " + retry +
           " s";
  }
  if (d.reason == kReasonTpot) {
    return std::string("the ") + sla_class_name(c) +
           " class's running requests are behind their time-per-output-token objective; retry after " + retry + " s";
  }
  if (d.reason == kReasonOverloaded) return "the server is at its limit of concurrent choices";
  return std::string("the ") + sla_class_name(c) + " queue is full; retry after " + retry + " s";
}

Decision FrontDoor::refuse(const CallRequest& r, Decision d) {
  d.admit = false;
  if (d.message.empty()) d.message = message_for(d, r.sla_class);
  count_refusal(r.model ? r.model->id() : std::string(), r.sla_class, d.reason);
  return d;
}

TenantSlot::~TenantSlot() {
  if (!taken_over_.load()) door_->quota_.leave(tenant_, now_ns());
}

Decision FrontDoor::enter(const std::string& tenant, SlaClass cls, std::shared_ptr<TenantSlot>* slot) {
  slot->reset();
  Decision d = quota_.enter(tenant, now_ns());
  if (!d.admit) {
    d.message = message_for(d, cls);
    auto m = registry_.default_model();
    count_refusal(m ? m->id() : std::string(), cls, d.reason);
    return d;
  }
  *slot = std::shared_ptr<TenantSlot>(new TenantSlot(this, tenant));
  return d;
}

Decision FrontDoor::admit(const CallRequest& r) {
  METRO_CHECK(r.model != nullptr);
  const ServedModel& m = *r.model;
  const int64_t now = now_ns();
  const int64_t charge = static_cast<int64_t>(r.prompt_tokens) + static_cast<int64_t>(r.max_tokens) * r.n_choices;
  // The tenant's quota first: a tenant over its share is told so (429) even when the server
  // has room, and its requests never take queue places. A slot taken before tokenizing is
  // this request's from here on: its release is the Call's, or the refund below.
  Decision q;
  if (r.slot) {
    METRO_CHECK(r.slot->tenant() == r.tenant && !r.slot->taken_over_.exchange(true));
    q = quota_.charge(r.tenant, charge, now);
    if (!q.admit) quota_.leave(r.tenant, now);
  } else {
    q = quota_.admit(r.tenant, charge, now);
  }
  if (!q.admit) return refuse(r, std::move(q));
  auto refund = [&] { quota_.release(r.tenant, charge, 0, -1.0, now); };  // nothing ran
  // Prefix-cache hits are not queued work (embeddings compute every position).
  int cached = 0;
  for (const engine::Request& e : r.requests) {
    if (r.cached_answer) break;
    if (e.kind == engine::RequestKind::kGenerate) {
      cached += m.engine->cached_prefix_tokens(e.prompt, true, r.tenant, m.adapter);
    }
  }
  const int queued = r.cached_answer ? 0 : uncached(r.prompt_tokens, cached);
  if (m.admission && !r.cached_answer) {
    Decision a = m.admission->admit(r.sla_class, queued, r.tenant, r.deadline_ns, now);
    if (!a.admit) {
      // Refused for lack of capacity (not for the request's own shape): the engine's
      // adaptive controller counts it as load it could not see in its queue.
      if (a.http_status == 503) m.engine->note_overload(now);
      refund();
      return refuse(r, std::move(a));
    }
  }
  if (inflight_choices_.fetch_add(r.n_choices) + r.n_choices > cfg_.max_inflight_choices) {
    inflight_choices_.fetch_sub(r.n_choices);
    if (m.admission && !r.cached_answer) m.admission->release(r.sla_class, queued, r.tenant, now);
    refund();
    return refuse(r, Decision::reject(503, kReasonOverloaded, 1.0));
  }
  auto call = std::shared_ptr<Call>(new Call(this, r, queued, now));
  call->queued_ = !r.cached_answer;
  if (r.cached_answer) {
    Decision d = Decision::admitted();
    d.call = std::move(call);
    return d;
  }
  // Requests behind it that share its prefix are credited with it from now on, and what
  // of it the KV spill tier holds starts coming back from disk while it waits.
  for (const engine::Request& e : r.requests) {
    if (e.kind != engine::RequestKind::kGenerate) continue;
    if (auto hold = m.engine->hold_pending_prefix(e.prompt, r.tenant, m.adapter)) {
      call->pending_prefixes_.push_back(std::move(hold));
    }
    m.engine->prefetch_prefix(e.prompt, r.tenant, m.adapter);
  }
  Decision d = Decision::admitted();
  d.call = std::move(call);
  return d;
}

Expected<std::pair<double, double>> measure_prefill(engine::Engine& eng, int n_tokens) {
  engine::Request r;
  // An encoder makes embeddings only: its one timed pass is an embedding (no decode step).
  const bool encoder = eng.model().hparams().encoder;
  r.kind = encoder ? engine::RequestKind::kEmbed : engine::RequestKind::kGenerate;
  const int n = std::max(8, std::min(n_tokens, eng.n_ctx() - 2));
  // Any valid ids will do: the cost of a step does not depend on which tokens it holds.
  const int32_t vocab = static_cast<int32_t>(eng.tokenizer().n_vocab());
  r.prompt.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) r.prompt.push_back(static_cast<int32_t>((1000 + 7 * i) % vocab));
  r.stop.max_tokens = 2;
  r.stop.ignore_eos = true;
  const int64_t t0 = now_ns();
  int64_t first_ns = 0, last_ns = 0;
  METRO_ASSIGN_OR_RETURN(engine::Handle h, eng.submit(std::move(r)));
  for (;;) {
    auto e = h.stream->pop(std::chrono::milliseconds(60000));
    if (!e) return internal_error("calibration: the engine did not answer in 60 s");
    if ((e->kind == engine::Event::Kind::kDelta && !e->tokens.empty()) || e->kind == engine::Event::Kind::kEmbedding) {
      (first_ns == 0 ? first_ns : last_ns) = now_ns();
    } else if (e->kind == engine::Event::Kind::kFinish && e->reason == engine::FinishReason::kError) {
      return internal_error("calibration: " + e->message);
    } else if (e->kind == engine::Event::Kind::kDone) {
      break;
    }
  }
  if (first_ns == 0) return internal_error("calibration: no token came back");
  const double prefill_s = static_cast<double>(first_ns - t0) * 1e-9;
  const double step_s = last_ns > first_ns ? static_cast<double>(last_ns - first_ns) * 1e-9 : 0.0;
  return std::make_pair(n / std::max(prefill_s, 1e-6), step_s);
}

}  // namespace metro::gateway
