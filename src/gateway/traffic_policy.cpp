#include "gateway/traffic_policy.h"

#include <algorithm>
#include <chrono>

#include "base/clock.h"

namespace metro::gateway {

Status validate(const TrafficPolicyConfig& cfg) {
  METRO_RETURN_IF_ERROR(validate(cfg.admission_cfg));
  METRO_RETURN_IF_ERROR(validate(cfg.default_quota));
  for (const auto& [name, q] : cfg.tenant_quotas) {
    if (Status s = validate(q); !s.ok()) return invalid_argument("tenant '" + name + "': " + s.message());
  }
  return Status();
}

namespace {
AdmissionConfig without_metrics(AdmissionConfig c) {
  c.metrics = nullptr;
  return c;
}
}  // namespace

TrafficPolicy::TrafficPolicy(const TrafficPolicyConfig& cfg)
    : cfg_(cfg), admission_(without_metrics(cfg.admission_cfg)), quota_(cfg.default_quota, nullptr) {
  for (const auto& [name, q] : cfg_.tenant_quotas) quota_.set_quota(name, q);
}

void TrafficPolicy::count_refusal(sched::SlaClass c, const std::string& reason) {
  if (sched::SchedMetrics* m = metrics_.load(std::memory_order_acquire)) m->observe_rejection(c, reason);
}

Decision TrafficPolicy::admit(const TrafficRequest& r, int64_t now_ns) {
  // The tenant's quota first: a tenant over its share is told so (429) even when the server
  // has room, and its requests never take queue seats.
  Decision q = quota_.admit(r.tenant, r.sla_class, charge(r), now_ns);
  if (!q.admit) {
    count_refusal(r.sla_class, q.reason);
    return q;
  }
  if (!cfg_.admission) return q;
  AdmissionRequest ar;
  ar.sla_class = r.sla_class;
  ar.prompt_tokens = uncached(r);
  ar.deadline_ns = r.deadline_ns;
  ar.tenant = r.tenant;
  Decision a = admission_.admit(ar, now_ns);
  if (!a.admit) {
    quota_.release(r.tenant, charge(r), 0, -1.0, now_ns);  // nothing ran: refund it all
    count_refusal(r.sla_class, a.reason);
  }
  return a;
}

void TrafficPolicy::first_token(const TrafficRequest& r) {
  if (cfg_.admission) admission_.release(r.sla_class, uncached(r), r.tenant);
}

void TrafficPolicy::done(const TrafficRequest& r, int64_t used_tokens, double duration_s, int64_t now_ns) {
  quota_.release(r.tenant, charge(r), used_tokens, duration_s, now_ns);
}

void TrafficPolicy::observe_step(const engine::StepReport& rep) {
  if (!cfg_.admission) return;
  StepObservation o;
  o.step_s = rep.step_s;
  o.prefill_tokens = rep.prefill_tokens_by_class;
  const int all = rep.prefill_tokens + rep.decode_seqs;
  o.prefill_s = all > 0 ? rep.step_s * rep.prefill_tokens / all : 0.0;
  for (size_t c = 0; c < o.backlogged.size(); ++c) {
    // A class had prompts waiting when the step began if it got prompt tokens in it or still
    // has prompts waiting after it.
    o.backlogged[c] = rep.prefill_tokens_by_class[c] > 0 || rep.waiting_by_class[c] > 0;
  }
  admission_.observe_step(o);
}

Expected<double> TrafficPolicy::calibrate(engine::Engine& eng, int n_tokens) {
  engine::Request r;
  r.kind = engine::RequestKind::kGenerate;
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
    if (e->kind == engine::Event::Kind::kDelta && !e->tokens.empty()) {
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
  const double rate = n / std::max(prefill_s, 1e-6);
  if (cfg_.admission) admission_.calibrate(rate, step_s);
  return rate;
}

}  // namespace metro::gateway
