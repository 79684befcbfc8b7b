// Precision tiers in the engine (EngineConfig::low_tier): the controller's decision at the
// start of each step, the pins, the step's passes (one per tier present), and the quality
// monitor's part (samples of low-tier outputs to the shadow scorer, rollbacks).
#include <algorithm>

#include "base/clock.h"
#include "base/log.h"
#include "engine/engine_impl.h"

namespace metro::engine {

namespace {

// Salts the prefix-cache scope of sequences computed by the low tier.
constexpr uint64_t kLowTierScope = 0x9e3779b97f4a7c15ull;

}  // namespace

adaptive::Tier Engine::Impl::tier_of(const Choice& c) const {
  const Request& q = c.req->req;
  if (q.tier) return *q.tier;
  // Pins by kind and class: an embedding must not depend on the load, and realtime
  // requests are the ones the high tier is kept for.
  if (q.kind == RequestKind::kEmbed) return adaptive::Tier::kHigh;
  if (q.sla_class == SlaClass::kRealtime && self->cfg_.tier_control.pin_realtime) return adaptive::Tier::kHigh;
  return decision.tier;
}

void Engine::Impl::decide_tier(int64_t now) {
  check_quality(now);
  adaptive::LoadSignal s;
  s.now_s = static_cast<double>(now) * 1e-9;
  int64_t waiting_tokens = 0;
  SlaClass waiting_class = SlaClass::kBatch, running_class = SlaClass::kBatch;
  for (const auto& [id, c] : by_seq) {
    if (!c->in_scheduler || c->finished) continue;
    if (c->seq.status == sched::SeqStatus::kWaiting) {
      ++s.waiting;
      waiting_tokens += c->seq.n_uncomputed();
      waiting_class = std::min(waiting_class, c->seq.sla_class);
    } else {
      ++s.running;
      running_class = std::min(running_class, c->seq.sla_class);
    }
  }
  // The waiting prompts at the scheduler's fitted cost per prompt token (a millisecond per
  // token until the fit is known).
  const double per_token = stats.scheduler.step_cost.known() ? stats.scheduler.step_cost.per_prefill_token_s : 1e-3;
  s.queue_ttft_s = static_cast<double>(waiting_tokens) * per_token;
  s.ttft_objective_s = self->cfg_.sla.of(waiting_class).ttft_s;
  s.tpot_s = tpot_ewma_s;
  s.tpot_objective_s = self->cfg_.sla.of(running_class).tpot_s;
  const int64_t overload = last_overload_ns.load(std::memory_order_relaxed);
  if (overload > 0) s.since_overload_s = static_cast<double>(now - overload) * 1e-9;
  s.kv_used = stats.kv_blocks_total > 0 ? static_cast<double>(stats.kv_blocks_used) / stats.kv_blocks_total : 0.0;
  const adaptive::Tier before = decision.tier;
  decision = tiers->decide(s);
  sched->set_step_scale(decision.step_scale);
  // KV depends on the weights: a waiting sequence looks up (and will publish) prefix-cache
  // blocks only in the scope of the tier it is about to run in.
  for (auto& [id, c] : by_seq) {
    if (!c->in_scheduler || c->finished || c->seq.status != sched::SeqStatus::kWaiting) continue;
    c->kv_tier = tier_of(*c);
    c->kv_mixed = false;
    c->seq.cache_scope = self->cache_scope(c->req->req.tenant, c->req->req.adapter) ^ (c->kv_tier == adaptive::Tier::kLow ? kLowTierScope : 0);
  }
  if (decision.tier != before) {
    METRO_LOG_INFO("precision tier %s -> %s (%s, pressure %.2f)", adaptive::tier_name(before),
                   adaptive::tier_name(decision.tier), adaptive::load_mode_name(decision.mode), decision.pressure);
  }
  std::lock_guard<std::mutex> lock(stats_mu);
  stats.tier = tiers->stats();
  stats.tier_steps = tier_steps;
  stats.tier_tokens = tier_tokens;
}

Expected<model::ForwardOutput> Engine::Impl::forward_tiers(const sched::StepPlan& plan,
                                                           const model::ForwardOptions& fo) {
  // The plan is ordered high tier first (step()); h entries and h_tokens tokens of it.
  size_t h = 0;
  int h_tokens = 0;
  while (h < plan.seqs.size() && tier_of(*by_seq.at(plan.seqs[h].seq->id)) == adaptive::Tier::kHigh) {
    h_tokens += plan.seqs[h].n_tokens;
    ++h;
  }
  auto mark = [&](size_t begin, size_t end, adaptive::Tier t) {
    const size_t ti = static_cast<size_t>(t);
    ++tier_steps[ti];
    for (size_t i = begin; i < end; ++i) {
      Choice& c = *by_seq.at(plan.seqs[i].seq->id);
      c.tier = t;
      if (t != c.kv_tier && !c.kv_mixed) {
        // Its KV so far is the other tier's: what it computes from now on follows from
        // neither tier alone, so none of it goes to the prefix cache.
        c.kv_mixed = true;
        kv->stop_publishing(c.seq.id);
      }
      c.req->usage.tiers = static_cast<uint8_t>(c.req->usage.tiers | (1u << ti));
      tier_tokens[ti] += static_cast<uint64_t>(plan.seqs[i].n_tokens);
    }
  };
  const model::Model& high = *self->model_;
  const model::Model& low = *self->cfg_.low_tier;
  if (h == plan.seqs.size() || h == 0) {
    const bool all_high = h == plan.seqs.size();
    mark(0, plan.seqs.size(), all_high ? adaptive::Tier::kHigh : adaptive::Tier::kLow);
    return (all_high ? high : low).forward(batch, arena->view(tables), all_high ? ws : ws_low, *pool, fo);
  }
  // Two passes over disjoint sequences of one KV arena: the high tier's entries, then the
  // low tier's (their sequence slots renumbered from 0). Outputs live in each tier's
  // workspace and are joined.
  auto pass = [&](const model::Model& m, model::Workspace& w, int tok_begin, int tok_end, size_t slot_begin,
                  size_t slot_end) {
    sub_batch.clear();
    for (int i = tok_begin; i < tok_end; ++i) {
      const size_t k = static_cast<size_t>(i);
      sub_batch.add(batch.token[k], batch.pos[k], batch.seq[k] - static_cast<int32_t>(slot_begin), batch.logits[k] != 0,
                    batch.adapter.empty() ? int16_t{0} : batch.adapter[k]);
    }
    sub_tables.assign(tables.begin() + static_cast<std::ptrdiff_t>(slot_begin),
                      tables.begin() + static_cast<std::ptrdiff_t>(slot_end));
    return m.forward(sub_batch, arena->view(sub_tables), w, *pool, fo);
  };
  mark(0, h, adaptive::Tier::kHigh);
  mark(h, plan.seqs.size(), adaptive::Tier::kLow);
  METRO_ASSIGN_OR_RETURN(model::ForwardOutput a, pass(high, ws, 0, h_tokens, 0, h));
  METRO_ASSIGN_OR_RETURN(model::ForwardOutput b, pass(low, ws_low, h_tokens, batch.size(), h, plan.seqs.size()));
  model::ForwardOutput out = a;
  out.batch_index = {};  // row -> token of the joined batch is not kept; the engine does not read it
  out.tail_logits = b.logits;
  out.tail_row = a.n_rows;
  out.n_rows = a.n_rows + b.n_rows;
  if (out.n_vocab == 0) out.n_vocab = b.n_vocab;
  out.tail_hidden = b.hidden;
  out.tail_token = h_tokens;
  return out;
}

void Engine::Impl::check_quality(int64_t now) {
  if (!shadow) return;
  const adaptive::ShadowSnapshot snap = shadow->snapshot();
  if (snap.generation == shadow_seen) return;
  shadow_seen = snap.generation;
  const adaptive::ShadowConfig& sc = shadow->config();
  if (snap.in_window < sc.min_samples) return;
  const double cooldown = tiers->config().rollback_cooldown_s;
  if (snap.kl_mean > sc.kl_max) {
    METRO_LOG_WARN("precision rollback: shadow KL %.4f over the last %zu low-tier samples exceeds %.4f; high tier "
                   "for %.0f s", snap.kl_mean, snap.in_window, sc.kl_max, cooldown);
    tiers->rollback("shadow_kl", static_cast<double>(now) * 1e-9);
    shadow->reset_window();
    return;
  }
  const auto worst = std::max_element(snap.layer_drift.begin(), snap.layer_drift.end());
  if (worst != snap.layer_drift.end() && *worst > sc.drift_max) {
    METRO_LOG_WARN("precision rollback: layer %d drifts %.3f from the high tier over the last %zu low-tier samples "
                   "(bound %.3f); high tier for %.0f s", static_cast<int>(worst - snap.layer_drift.begin()), *worst,
                   snap.in_window, sc.drift_max, cooldown);
    tiers->rollback("drift", static_cast<double>(now) * 1e-9);
    shadow->reset_window();
  }
}

void Engine::Impl::offer_shadow(ActiveRequest& r) {
  if (r.aborting || r.req.kind != RequestKind::kGenerate) return;
  if ((r.usage.tiers & (1u << static_cast<unsigned>(adaptive::Tier::kLow))) == 0) return;
  if (!shadow->wants_next()) return;
  const sched::SeqState& s = r.choices[0]->seq;
  shadow->offer(s.tokens, s.n_prompt);
}

}  // namespace metro::engine
