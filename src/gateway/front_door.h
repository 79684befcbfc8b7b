// The gateway's front door: every model request passes it, below HTTP. The server hands it
// one request type (CallRequest, after parsing and tokenizing) and gets one decision type
// back (Decision: refused with a status, a reason and a Retry-After, or admitted with a
// Call). It owns the request's way through the gateway:
//
//   resolve (which served model) -> admit (tenant quota 429, the model's admission control
//   503, the server's bound on in-flight choices 503) -> submit (to the engine, or through
//   the embeddings batching window) -> first token (leaves the admission queue) -> finish
//   (quota refund of what was not used)
//
// and the models themselves (add_model: registry, admission per model fed by the engine's
// step reports, metrics). The server keeps transport: parse, validate, stream, disconnect.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/metrics.h"
#include "base/sla.h"
#include "base/status.h"
#include "engine/engine.h"
#include "gateway/admission.h"
#include "gateway/batch_window.h"
#include "gateway/decision.h"
#include "gateway/embed_batcher.h"
#include "gateway/model_registry.h"
#include "gateway/quota.h"
#include "gateway/variant_guard.h"

namespace metro::gateway {

// Admission control on each model's class queues (predicted TTFT, queue bounds, deadlines).
// Off, only quotas and the choice bound refuse. Auto: on for a model whose scheduling policy
// serves classes in priority order (its queue order says so), off for first-come-first-served.
enum class AdmissionMode : uint8_t { kOff, kOn, kAuto };

struct FrontDoorConfig {
  AdmissionMode admission = AdmissionMode::kOn;
  AdmissionConfig admission_cfg;  // for every model; its sla is replaced by `sla`
  SlaConfig sla;                  // per-class objectives
  TenantQuota default_quota;      // for tenants without their own (unlimited by default)
  std::vector<std::pair<std::string, TenantQuota>> tenant_quotas;
  int max_inflight_choices = 8192;  // choices over all admitted requests; 503 above
  // Embeddings batching window; none: embeddings go to the engine at once.
  std::optional<BatchWindowConfig> embed_window;
  // Measure each model with a timed prefill when it is added (admission starts from it).
  bool calibrate = true;
  // The variants' circuit breakers and rollout tests.
  GuardConfig guard;
};

Status validate(const FrontDoorConfig& cfg);

class FrontDoor;

// A tenant's place taken before its request is parsed and tokenized (FrontDoor::enter):
// its concurrency slot. admit() takes it over; dropped unused, it gives the slot back.
class TenantSlot {
 public:
  ~TenantSlot();
  TenantSlot(const TenantSlot&) = delete;
  TenantSlot& operator=(const TenantSlot&) = delete;
  const std::string& tenant() const { return tenant_; }

 private:
  friend class FrontDoor;
  TenantSlot(FrontDoor* door, std::string tenant) : door_(door), tenant_(std::move(tenant)) {}
  FrontDoor* door_;
  std::string tenant_;
  std::atomic<bool> taken_over_{false};
};

// One model request, as the server hands it over.
struct CallRequest {
  std::shared_ptr<const ServedModel> model;  // from FrontDoor::resolve()
  std::string tenant;                         // "" without API keys
  SlaClass sla_class = SlaClass::kStandard;
  int64_t deadline_ns = 0;                    // first token due by then (now_ns clock); 0: none
  std::vector<engine::Request> requests;      // one per prompt, tokenized
  int prompt_tokens = 0;                      // over every prompt
  int max_tokens = 0;                         // per choice
  int n_choices = 1;                          // prompts x n
  // From enter(), when the server took the tenant's slot before tokenizing (null: admit()
  // takes it itself). Must be the same tenant's.
  std::shared_ptr<TenantSlot> slot;
  // Answered from the semantic cache: the tenant's quota is charged, but the call takes no
  // place in the engine's admission queue (it costs the engine nothing).
  bool cached_answer = false;
};

// How an admitted request ended.
struct CallOutcome {
  bool completed = false;  // false: aborted, client gone, refused downstream, engine error
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

class FrontDoor;

// An admitted request, from admission to its end. Exactly one finish() (the destructor
// finishes it as not completed if nobody did) and at most one release of its admission
// queue place (first_token(), or finish() when no token came). Calls from one thread or
// strand at a time, except the submit callback (see submit()).
class Call : public std::enable_shared_from_this<Call> {
 public:
  using Submitted = std::function<void(Expected<std::vector<engine::Handle>>)>;

  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  // Hands the requests to the engine: at once (`done` runs before submit() returns) or, for
  // embeddings with the batching window on, with the others of their batch (`done` runs
  // on the window's thread). A refusal by the engine aborts every request already started.
  void submit(std::vector<engine::Request> requests, Submitted done);
  // The request's first token is out: it leaves its admission queue. Idempotent.
  void first_token();
  // Ends the request: refunds the quota charge beyond what was used, lets its queue place
  // and in-flight choices go, aborts what still runs in the engine. Idempotent.
  void finish(const CallOutcome& outcome);

  const ServedModel& model() const { return *model_; }
  engine::Engine& engine() const { return *model_->engine; }

 private:
  friend class FrontDoor;
  Call(FrontDoor* door, const CallRequest& r, int uncached_prompt_tokens, int64_t admitted_ns);

  FrontDoor* door_;
  std::shared_ptr<const ServedModel> model_;
  std::string tenant_;
  SlaClass sla_class_;
  int uncached_prompt_tokens_;   // what it occupies in the admission queue
  int64_t charge_tokens_;        // what the quota charged
  int n_choices_;
  int64_t start_ns_;             // when it was admitted (now_ns clock)
  bool embeddings_ = false;
  bool queued_ = false;          // holds an admission queue place
  bool finished_ = false;
  std::vector<std::shared_ptr<const kv::PendingPrefix>> pending_prefixes_;
  // Shared with the batching window's thread.
  std::mutex mu_;
  bool ended_ = false;           // finish() ran: handles that arrive later are aborted
  std::vector<uint64_t> engine_ids_;  // requests started in the engine
  uint64_t window_ticket_ = 0;   // while held by the batching window
};

class FrontDoor {
 public:
  // cfg must pass validate(). Series go into `registry` (null: one of its own).
  explicit FrontDoor(const FrontDoorConfig& cfg, std::shared_ptr<metrics::Registry> registry = nullptr);
  ~FrontDoor();
  FrontDoor(const FrontDoor&) = delete;
  FrontDoor& operator=(const FrontDoor&) = delete;

  // Serves `model` from now on: registers it, its metrics and, with admission on, its
  // admission control (calibrated by a timed prefill unless the config says not to).
  Status add_model(std::shared_ptr<ServedModel> model);
  // Serves `base`'s engine with LoRA adapter `adapter` of its model as `name`: one engine,
  // so the same queue, admission and engine series as the base; a name of its own.
  Status add_adapter(const std::string& name, const std::shared_ptr<const ServedModel>& base, int16_t adapter);
  // Stops serving a model or variant (ModelRegistry::remove; the guard forgets it). Its
  // engine stops when the last request using it has ended.
  Status remove_model(const std::string& name, const std::string& variant);
  // The model a request names ("" or absent: the default model), the variant the split
  // gives `sticky_key` (ModelRegistry::pick); null when not served.
  std::shared_ptr<const ServedModel> resolve(const std::string& name, std::string_view sticky_key = {}) const;
  const ModelRegistry& models() const { return registry_; }
  // Faults, breakers and rollouts of the served variants.
  VariantGuard& guard() { return guard_; }
  // ModelRegistry::set_split.
  Status set_split(const std::string& name, const std::string& variant, double share) {
    return registry_.set_split(name, variant, share);
  }

  // Before a request's body is parsed and tokenized (work that grows with its size): the
  // tenant's concurrency quota, and a tenant whose token bucket is empty, are refused here,
  // so that a tenant cannot make the server tokenize more of its requests than its quota
  // lets run. Admitted, the decision carries nothing; `*slot` holds the place until
  // admit() takes it over or it is dropped. Thread-safe.
  Decision enter(const std::string& tenant, SlaClass cls, std::shared_ptr<TenantSlot>* slot);
  // Decides for one request before any work is done for it (thread-safe).
  Decision admit(const CallRequest& r);

  metrics::Registry& metrics() { return *metrics_; }
  std::shared_ptr<metrics::Registry> metrics_registry() const { return metrics_; }
  const FrontDoorConfig& config() const { return cfg_; }
  int64_t inflight_choices() const { return inflight_choices_.load(); }
  QuotaManager& quotas() { return quota_; }
  EmbedBatcher* embed_window() const { return window_.get(); }
  // Stops the batching window (what it holds is submitted) and drops every model.
  void shutdown();

 private:
  friend class Call;
  friend class TenantSlot;
  Decision refuse(const CallRequest& r, Decision d);
  void count_refusal(const std::string& model, SlaClass c, const std::string& reason);
  std::string message_for(const Decision& d, SlaClass c) const;

  FrontDoorConfig cfg_;
  std::shared_ptr<metrics::Registry> metrics_;
  ModelRegistry registry_;
  VariantGuard guard_{registry_, cfg_.guard};
  QuotaManager quota_;
  std::shared_ptr<EmbedBatcher> window_;
  std::atomic<int64_t> inflight_choices_{0};
  mutable std::mutex refusals_mu_;
  std::map<std::tuple<std::string, int, std::string>, uint64_t> refusals_;  // (model, class, reason)
  metrics::Registration own_metrics_;
};

// Measures an engine once (a timed prefill of `n_tokens` prompt tokens, then one decode
// step): the prompt tokens per second and the decode step's seconds. Also pages the weights
// in before the first client.
Expected<std::pair<double, double>> measure_prefill(engine::Engine& eng, int n_tokens = 256);

}  // namespace metro::gateway
