// One engine step, in named stages: propose -> schedule -> build batch -> forward -> sample
// (verify drafts) -> update -> pool embeddings -> emit -> report.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>

#include "base/clock.h"
#include "base/log.h"
#include "base/residency.h"
#include "engine/engine_impl.h"

namespace metro::engine {

namespace {

// How long steps may plan nothing while requests wait before the engine reports it.
constexpr int64_t kStuckReportNs = 10'000'000'000;

void observe(std::vector<uint64_t>& buckets, const std::vector<double>& bounds, double v) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (v <= bounds[i]) ++buckets[i];
  }
  ++buckets[bounds.size()];  // +Inf
}

// Tokens this step commits to or drafts after the sequence's computed ones.
int32_t token_at(const sched::SeqState& s, int pos) {
  const size_t p = static_cast<size_t>(pos);
  return p < s.tokens.size() ? s.tokens[p] : s.draft[p - s.tokens.size()];
}

}  // namespace

void Engine::Impl::step() {
  const int64_t t0 = now_ns();
  propose_s = 0.0;
  if (tiers) decide_tier(t0);
  propose();
  sched::StepPlan plan = sched->schedule(t0);
  if (plan.empty()) {
    // Nothing fits right now (should not happen: submit() refuses what can never fit).
    for (auto& [id, c] : by_seq) c->seq.draft.clear();
    if (idle_since_ns == 0) idle_since_ns = t0;
    if (!idle_reported && t0 - idle_since_ns > kStuckReportNs) {
      // Requests wait and no step runs: the scheduler's state says why.
      idle_reported = true;
      METRO_LOG_ERROR("engine: no step has run for %.0f s while %zu requests wait; scheduler state:\n%s",
                      static_cast<double>(t0 - idle_since_ns) * 1e-9, active.size(), sched->describe().c_str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return;
  }
  idle_since_ns = 0;
  idle_reported = false;
  if (tiers) {
    // High tier first: the two tiers' entries become two contiguous passes.
    std::stable_partition(plan.seqs.begin(), plan.seqs.end(), [&](const sched::ScheduledSeq& ss) {
      return tier_of(*by_seq.at(ss.seq->id)) == adaptive::Tier::kHigh;
    });
  }
  bool want_hidden = false;
  build_batch(plan, &want_hidden);
  model::KvView view = arena->view(tables);
  model::ForwardOptions fo;
  fo.want_hidden = want_hidden;
  // Per-op time, for the step report's attention seconds: always where timing is cheap
  // (a host backend), else only while an observer reads it.
  backends::StepProfile profile;
  bool time_ops = self->model_->backend()->cheap_op_timing();
  for (const auto& o : current_observers()) time_ops = time_ops || o->wants_op_times();
  if (time_ops) fo.observer = &profile;
  const uint64_t faults0 = major_page_faults();
  auto out = tiers ? forward_tiers(plan, fo) : self->model_->forward(batch, view, ws, *pool, fo);
  step_faults = major_page_faults() - faults0;
  if (!out.ok()) {
    METRO_LOG_ERROR("engine step failed: %s", out.status().to_string().c_str());
    for (const auto& ss : plan.seqs) {
      ss.seq->draft.clear();
      abort_request(*by_seq.at(ss.seq->id)->req, "internal error: " + out.status().message());
    }
    for (auto& [id, c] : by_seq) c->seq.draft.clear();
    return;
  }
  sched::StepResult result;
  sample(plan, *out, &result);
  sched->update(plan, result);
  publish_spec_stats();
  pool_embeddings(plan, *out);
  emit(plan, *out);
  report(plan, *out, profile, t0);
  if (!kv_event_log.empty()) self->cfg_.kv_events(kv_event_log.take());
  progress_ns.store(now_ns(), std::memory_order_relaxed);
}

// Drafts for every decoding sequence, from the proposer (none without one); the controller
// then decides how many of each the step computes. A proposer that runs a model is asked
// for k first (its passes cost time), then drafts that many for all sequences at once.
void Engine::Impl::propose() {
  speculative::Proposer* proposer = self->cfg_.proposer.get();
  // Under high load the tier controller turns drafting off (its rows are compute the
  // batch needs); tokens a grammar forces are drafted still, being always accepted.
  const bool speculate = !tiers || decision.speculate;
  const int k_max = proposer != nullptr && speculate ? self->cfg_.max_draft_tokens : 0;
  const speculative::DraftSource model_source =
      k_max > 0 ? proposer->model_source() : speculative::DraftSource::kNone;
  const bool by_model = model_source != speculative::DraftSource::kNone;
  const speculative::DraftCost draft_cost = k_max > 0 ? proposer->cost() : speculative::DraftCost{};
  candidates.clear();
  int decoding = 0;
  for (auto& [id, c] : by_seq) {
    sched::SeqState& s = c->seq;
    s.draft.clear();
    c->draft_source = speculative::DraftSource::kNone;
    if (!c->in_scheduler || c->finished || c->req->aborting || c->sampler == nullptr) continue;
    if (s.status != sched::SeqStatus::kRunning || s.n_uncomputed() != 1) continue;
    ++decoding;
    // The step adds the accepted drafts and one more token: stay within max_tokens and the
    // context window.
    const int room = std::min(c->req->req.stop.max_tokens - s.n_generated(),
                              self->n_ctx_ - static_cast<int>(s.tokens.size())) - 1;
    // Tokens the grammar forces are drafts that are always accepted: verified in this step
    // instead of one step each, whatever the proposer or the controller would say.
    if (c->matcher && room > 0 && self->cfg_.jump_forward && forced_draft(*c, std::min(room, kMaxForcedTokens))) {
      continue;
    }
    if (k_max <= 0 || !c->req->req.speculative) continue;
    const int k = std::min(k_max, room);
    if (k <= 0) continue;
    const speculative::ProposeInput in{c->req->id, &s, c->req->req.prediction};
    if (by_model) {
      // The catch-up is spread over the tokens the sequence is expected to still generate:
      // no more than it has generated so far (an answer that has run long tends to run on),
      // within its max_tokens.
      const int expected = std::min(c->req->req.stop.max_tokens - s.n_generated(), std::max(1, s.n_generated()));
      candidates.push_back(speculative::DraftCandidate{s.id, model_source, k, 0, proposer->catch_up(in), expected});
      continue;
    }
    proposal.clear();
    const speculative::DraftSource source = proposer->propose(in, k, proposal);
    if (proposal.size() > static_cast<size_t>(k)) proposal.resize(static_cast<size_t>(k));
    take_draft(*c, source, proposal);
    if (!s.draft.empty()) candidates.push_back(speculative::DraftCandidate{s.id, source, static_cast<int>(s.draft.size()), 0});
  }
  if (candidates.empty()) return;
  if (self->cfg_.adaptive_drafts) {
    speculative::StepShape shape;
    shape.decode_seqs = decoding;
    shape.prefill_tokens = last_prefill_tokens;
    shape.draft_room = std::max(0, self->cfg_.max_batch_tokens - decoding - last_prefill_tokens);
    shape.draft_cost = draft_cost;
    shape.last_step_s = last_step_s;
    controller.plan(candidates, shape);
  } else {
    for (speculative::DraftCandidate& d : candidates) d.k = d.proposed;
  }
  if (!by_model) {
    for (const speculative::DraftCandidate& d : candidates) {
      Choice& c = *by_seq.at(d.seq_id);
      c.seq.draft.resize(static_cast<size_t>(d.k));
      if (d.k == 0) c.draft_source = speculative::DraftSource::kNone;
    }
    return;
  }
  const int64_t t0 = now_ns();
  draft_jobs.clear();
  draft_tokens.resize(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    const speculative::DraftCandidate& d = candidates[i];
    if (d.k == 0) continue;
    Choice& c = *by_seq.at(d.seq_id);
    draft_tokens[i].clear();
    draft_jobs.push_back(speculative::DraftJob{{c.req->id, &c.seq, c.req->req.prediction}, d.k, &draft_tokens[i]});
  }
  if (!draft_jobs.empty()) proposer->draft(draft_jobs, *pool);
  for (size_t i = 0; i < candidates.size(); ++i) {
    const speculative::DraftCandidate& d = candidates[i];
    if (d.k == 0) continue;
    std::vector<int32_t>& t = draft_tokens[i];
    if (t.size() > static_cast<size_t>(d.k)) t.resize(static_cast<size_t>(d.k));
    take_draft(*by_seq.at(d.seq_id), model_source, t);
  }
  propose_s = static_cast<double>(now_ns() - t0) * 1e-9;
}

bool Engine::Impl::forced_draft(Choice& c, int room) {
  if (c.grammar_stuck) return false;
  grammar::Matcher probe(*c.matcher);
  sched::SeqState& s = c.seq;
  while (static_cast<int>(s.draft.size()) < room && probe.can_continue()) {
    probe.fill_mask(forced_mask);
    int32_t only = -1;
    bool one = true;
    for (size_t w = 0; w < forced_mask.size() && one; ++w) {
      const uint64_t bits = forced_mask[w];
      if (bits == 0) continue;
      if (only >= 0 || (bits & (bits - 1)) != 0) one = false;
      only = static_cast<int32_t>(w * 64 + static_cast<size_t>(std::countr_zero(bits)));
    }
    // An end-of-generation token ends the text: the step samples it as usual.
    if (!one || only < 0 || self->tokenizer_.is_eog(only) || !probe.accept_token(only)) break;
    s.draft.push_back(only);
  }
  c.draft_source = s.draft.empty() ? speculative::DraftSource::kNone : speculative::DraftSource::kGrammar;
  return !s.draft.empty();
}

// A proposal as the sequence's draft: up to the first token outside the vocabulary, and
// for a constrained request up to the first token its grammar refuses (never accepted).
void Engine::Impl::take_draft(Choice& c, speculative::DraftSource source, const std::vector<int32_t>& tokens) {
  sched::SeqState& s = c.seq;
  s.draft.clear();
  const int32_t n_vocab = self->tokenizer_.n_vocab();
  for (int32_t t : tokens) {
    if (t < 0 || t >= n_vocab) break;  // a proposer's bad token ends its draft
    s.draft.push_back(t);
  }
  if (c.matcher && !s.draft.empty()) {
    grammar::Matcher probe(*c.matcher);
    size_t ok = 0;
    while (ok < s.draft.size() && probe.can_continue() && probe.accept_token(s.draft[ok])) ++ok;
    s.draft.resize(ok);
  }
  c.draft_source = s.draft.empty() ? speculative::DraftSource::kNone : source;
}

// The plan as one flat batch: each entry's committed tokens, then its drafts; logits for
// the last committed token and every draft of an entry that samples.
bool Engine::Impl::build_batch(const sched::StepPlan& plan, bool* want_hidden) {
  batch.clear();
  tables.clear();
  for (size_t slot = 0; slot < plan.seqs.size(); ++slot) {
    const sched::ScheduledSeq& ss = plan.seqs[slot];
    const Choice& c = *by_seq.at(ss.seq->id);
    const bool embed = c.req->req.kind == RequestKind::kEmbed;
    *want_hidden = *want_hidden || embed;
    tables.push_back(kv->table(ss.seq->id));
    const int begin = ss.seq->n_computed, end = begin + ss.n_tokens;
    const int first_logit = end - ss.logit_rows();
    for (int p = begin; p < end; ++p) {
      batch.add(token_at(*ss.seq, p), p, static_cast<int32_t>(slot), !embed && ss.sample && p >= first_logit,
                c.req->req.adapter);
    }
  }
  return true;
}

SampleResult Engine::Impl::sample_one(Choice& c, std::span<const float> logits) {
  const uint64_t* allowed = nullptr;
  if (c.matcher) {
    c.matcher->fill_mask(c.mask);
    bool any = false;
    for (uint64_t w : c.mask) any = any || w != 0;
    if (!any || c.grammar_stuck) {
      c.grammar_stuck = true;
      SampleResult s;
      s.token = 0;
      return s;
    }
    allowed = c.mask.data();
  }
  SampleResult s = c.sampler->sample(logits, c.history, scratch, allowed);
  if (c.matcher) {
    if (!c.matcher->accept_token(s.token)) c.grammar_stuck = true;
    s.grammar_done = !c.matcher->can_continue();
  } else if (!c.trigger_done && c.req->req.grammar && !c.req->req.grammar_trigger.empty()) {
    watch_trigger(c, s);
  }
  c.history.add_generated(s.token);
  return s;
}

// A free output becomes constrained once it spells the grammar's trigger: the matcher starts
// with the bytes from the trigger on (the grammar begins with it).
void Engine::Impl::watch_trigger(Choice& c, SampleResult& s) {
  const std::string& trigger = c.req->req.grammar_trigger;
  if (self->tokenizer_.is_eog(s.token)) return;
  c.trigger_tail += self->tokenizer_.token_to_piece(s.token);
  const size_t at = c.trigger_tail.find(trigger);
  if (at == std::string::npos) {
    if (c.trigger_tail.size() >= trigger.size()) c.trigger_tail.erase(0, c.trigger_tail.size() - (trigger.size() - 1));
    return;
  }
  c.trigger_done = true;
  auto m = std::make_unique<grammar::Matcher>(c.req->req.grammar);
  if (m->accept_bytes(std::string_view(c.trigger_tail).substr(at))) {
    s.grammar_done = !m->can_continue();
    c.matcher = std::move(m);
  }
  c.trigger_tail.clear();
}

// Samples each entry's rows in order: row i gives the token after draft i - 1; a draft is
// accepted while the sampled token equals it, so the tokens are exactly those one row per
// step would give. Accepted drafts and the token after them join seq.tokens.
void Engine::Impl::sample(const sched::StepPlan& plan, const model::ForwardOutput& out, sched::StepResult* result) {
  sampled.resize(std::max(sampled.size(), plan.seqs.size()));
  result->n_accepted.assign(plan.seqs.size(), 0);
  int row = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const sched::ScheduledSeq& ss = plan.seqs[i];
    Sampled& sm = sampled[i];
    sm.first_row = -1;
    sm.n_accepted = 0;
    sm.tokens.clear();
    Choice& c = *by_seq.at(ss.seq->id);
    const int rows = c.req->req.kind == RequestKind::kEmbed ? 0 : ss.logit_rows();
    if (rows == 0) continue;
    sm.first_row = row;
    row += rows;
    if (c.req->aborting || c.finished) {
      ss.seq->draft.clear();
      continue;
    }
    for (int r = 0; r < rows; ++r) {
      SampleResult s = sample_one(c, out.row(sm.first_row + r));
      const bool accepted = r < ss.n_draft && s.token == ss.seq->draft[static_cast<size_t>(r)];
      sm.tokens.push_back(std::move(s));
      if (!accepted) break;
      ++sm.n_accepted;
    }
    result->n_accepted[i] = sm.n_accepted;
    for (const SampleResult& s : sm.tokens) ss.seq->tokens.push_back(s.token);
    ss.seq->draft.clear();
    count_drafts(c, ss, sm.n_accepted);
  }
}

// Speculation's counters reach the stats before emit() can complete a request, so a client
// that has read its last token reads counters that include it. Drafts verified: a draft
// computed in the step its request was aborted in is not counted.
void Engine::Impl::publish_spec_stats() {
  std::lock_guard<std::mutex> lock(stats_mu);
  stats.draft_tokens = 0;
  stats.accepted_tokens = 0;
  for (size_t s = 0; s < spec_proposed.size(); ++s) {
    stats.draft_tokens += spec_proposed[s];
    stats.accepted_tokens += spec_accepted[s];
  }
  stats.spec_proposed = spec_proposed;
  stats.spec_accepted = spec_accepted;
  stats.spec_steps_by_k = spec_steps_by_k;
}

// Speculation's counters and the controller's acceptance estimate, per decoding entry; the
// request's prediction counts reach its usage before emit() may complete it.
void Engine::Impl::count_drafts(Choice& c, const sched::ScheduledSeq& ss, int accepted) {
  const bool decode = ss.n_tokens - ss.n_draft == 1 && ss.seq->n_computed >= ss.seq->n_prompt;
  if (!decode) return;
  if (!spec_steps_by_k.empty()) {
    ++spec_steps_by_k[static_cast<size_t>(std::min(ss.n_draft, static_cast<int>(spec_steps_by_k.size()) - 1))];
  }
  if (ss.n_draft == 0) return;
  const auto src = static_cast<size_t>(c.draft_source);
  spec_proposed[src] += static_cast<uint64_t>(ss.n_draft);
  spec_accepted[src] += static_cast<uint64_t>(accepted);
  controller.observe(ss.seq->id, c.draft_source, ss.n_draft, accepted);
  if (c.draft_source == speculative::DraftSource::kPrediction) {
    c.req->usage.accepted_prediction_tokens += accepted;
    c.req->usage.rejected_prediction_tokens += ss.n_draft - accepted;
  }
}

// Embedding requests: the mean of their final hidden states over every prompt token (or an
// encoder's CLS state, when it pools so).
void Engine::Impl::pool_embeddings(const sched::StepPlan& plan, const model::ForwardOutput& out) {
  int tok = 0;
  for (const sched::ScheduledSeq& ss : plan.seqs) {
    const int start_tok = tok;
    tok += ss.n_tokens;
    Choice& c = *by_seq.at(ss.seq->id);
    ActiveRequest& r = *c.req;
    if (r.req.kind != RequestKind::kEmbed || r.aborting || c.finished) continue;
    const model::HParams& hp = self->model_->hparams();
    const int n_embd = static_cast<int>(hp.n_embd);
    if (r.embed_sum.empty()) r.embed_sum.assign(static_cast<size_t>(n_embd), 0.0);
    // CLS pooling (an encoder's whole input is one chunk): the first token's state alone.
    const int n_rows = hp.encoder && hp.pooling == model::Pooling::kCls ? 1 : ss.n_tokens;
    for (int t = start_tok; t < start_tok + n_rows; ++t) {
      const float* h = out.hidden_row(t, n_embd);
      for (int d = 0; d < n_embd; ++d) r.embed_sum[static_cast<size_t>(d)] += h[d];
    }
    r.embed_rows += n_rows;
    if (ss.sample) finish_embedding(c);
  }
}

// Sampled tokens to their streams: text deltas, stop conditions, forks of n > 1.
void Engine::Impl::emit(const sched::StepPlan& plan, const model::ForwardOutput& out) {
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    Sampled& sm = sampled[i];
    if (sm.tokens.empty()) continue;
    Choice& c = *by_seq.at(plan.seqs[i].seq->id);
    ActiveRequest& r = *c.req;
    if (c.index == 0 && r.children_pending) fork_children(r, out.row(sm.first_row));
    const size_t base = c.seq.tokens.size() - sm.tokens.size();
    for (size_t j = 0; j < sm.tokens.size() && !c.finished && !r.aborting; ++j) {
      emit_token(c, std::move(sm.tokens[j]), base + j + 1);
    }
  }
}

void Engine::Impl::report(const sched::StepPlan& plan, const model::ForwardOutput& out,
                          const backends::StepProfile& profile, int64_t t0) {
  StepReport rep;
  if (tiers) rep.admission_ttft_margin_cap = decision.admission_ttft_margin_cap;
  uint64_t prompt_tokens = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const sched::ScheduledSeq& ss = plan.seqs[i];
    // Positions as planned (update() has moved n_computed since).
    const int committed = ss.n_tokens - ss.n_draft;
    const int accepted = i < sampled.size() ? sampled[i].n_accepted : 0;
    const int chunk_begin = ss.seq->n_computed - committed - accepted;
    const int prompt_part = std::max(0, std::min(ss.seq->n_prompt, chunk_begin + committed) - chunk_begin);
    prompt_tokens += static_cast<uint64_t>(prompt_part);
    rep.draft_tokens += ss.n_draft;
    rep.accepted_tokens += accepted;
    if (committed == 1 && chunk_begin >= ss.seq->n_prompt) {
      ++rep.cost.decode_seqs;
      ++rep.begun_by_class[static_cast<size_t>(ss.seq->sla_class)];
      if (i < sampled.size() && sampled[i].first_row >= 0) {
        rep.output_tokens_by_class[static_cast<size_t>(ss.seq->sla_class)] += 1 + accepted;
      }
      rep.cost.decode_ctx += static_cast<double>(chunk_begin + 1);
      // Drafts cost what a chunk of as many prompt tokens after the decode costs.
      rep.cost.prefill_tokens += ss.n_draft;
      rep.cost.prefill_pairs += sched::StepCostModel::pairs(ss.n_draft, chunk_begin + 1);
    } else {
      rep.cost.prefill_tokens += ss.n_tokens;
      rep.cost.prefill_pairs += sched::StepCostModel::pairs(ss.n_tokens, chunk_begin);
      rep.prefill_tokens_by_class[static_cast<size_t>(ss.seq->sla_class)] += prompt_part;
    }
  }
  rep.logit_rows = out.n_rows;
  const int prefill_only = static_cast<int>(rep.cost.prefill_tokens) - rep.draft_tokens;
  last_prefill_tokens = std::max(0, prefill_only);
  rep.attention_s = profile.seconds(backends::OpKind::kAttention);
  const int64_t t1 = now_ns();
  rep.cost.step_s = static_cast<double>(t1 - t0) * 1e-9;
  if (rep.cost.decode_seqs > 0) tpot_ewma_s = tpot_ewma_s > 0.0 ? 0.8 * tpot_ewma_s + 0.2 * rep.cost.step_s : rep.cost.step_s;
  // The scale a model proposer's costs are judged against until the controller's fit is
  // trusted: the step without its drafts, as the controller's cold assumption prices them.
  last_step_s = (rep.cost.step_s - propose_s) /
                (1.0 + speculative::DraftController::kColdRowFraction * rep.draft_tokens);
  const sched::SchedulerCounts counts = sched->counts();
  rep.waiting_by_class = counts.waiting_by_class;
  rep.running_by_class = counts.running_by_class;
  // Begun when the step started: its decodes (counted above) and the begun sequences it
  // left paused.
  plan_ids.clear();
  for (const sched::ScheduledSeq& ss : plan.seqs) plan_ids.push_back(ss.seq->id);
  std::sort(plan_ids.begin(), plan_ids.end());
  for (const auto& [id, c] : by_seq) {
    if (c->in_scheduler && !c->finished && c->seq.n_generated() > 0 &&
        !std::binary_search(plan_ids.begin(), plan_ids.end(), id)) {
      ++rep.begun_by_class[static_cast<size_t>(c->seq.sla_class)];
    }
  }
  for (int k = 0; k < kNumSlaClasses; ++k) {
    metrics.set_queue_depth(static_cast<SlaClass>(k), counts.waiting_by_class[static_cast<size_t>(k)],
                            counts.running_by_class[static_cast<size_t>(k)]);
  }
  sched->observe_step(rep.cost);
  if (spill && (step_count_for_spill++ & 63) == 0) {
    // Whether a spilled block is worth reading back weighs it against computing its tokens.
    const sched::StepCostModel cost = sched->stats().step_cost;
    spill->set_recompute_cost(cost.per_prefill_token_s, cost.per_attention_pair_s);
  }
  if (!spec_steps_by_k.empty()) {
    // The fit prices the step's own rows: a draft model's passes are priced by the proposer.
    controller.observe_step(rep.cost.step_s - propose_s, rep.cost.decode_seqs, last_prefill_tokens, rep.draft_tokens);
  }
  for (const auto& o : current_observers()) o->on_step(rep);
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    stats.prompt_tokens += prompt_tokens;
    if (!spec_steps_by_k.empty()) {
      stats.spec_fixed_s = controller.fixed_seconds();
      stats.spec_draft_row_s = controller.draft_row_seconds();
    }
  }
  publish_stats(rep.cost.step_s * 1e3, plan.n_tokens, static_cast<int>(plan.seqs.size()));
}

void Engine::Impl::fork_children(ActiveRequest& r, std::span<const float> logits) {
  r.children_pending = false;
  Choice& parent = *r.choices[0];
  // The parent's first token is already in its tokens; the children share the prompt only.
  const int prompt = parent.seq.n_prompt;
  for (size_t k = 1; k < r.choices.size(); ++k) {
    // An earlier child's first token can abort the request (its client stopped reading):
    // the parent's blocks are gone then, and a fork now would leak the copy's blocks.
    if (r.aborting) break;
    Choice& child = *r.choices[k];
    if (child.finished) continue;
    auto copy = kv->fork(parent.seq.id, child.seq.id, prompt);
    child.in_scheduler = true;
    if (!copy) {  // no block for the partial copy: compute the prompt like a new request
      sched->add(&child.seq);
      continue;
    }
    if (*copy) arena->copy_block((*copy)->src, (*copy)->dst);
    child.kv_tier = parent.kv_tier;  // the prompt's KV is the parent's
    child.kv_mixed = parent.kv_mixed;
    if (child.kv_mixed) kv->stop_publishing(child.seq.id);
    child.seq.n_computed = prompt;
    child.seq.n_cached_prompt = parent.seq.n_cached_prompt;
    SampleResult s = sample_one(child, logits);
    child.seq.tokens.push_back(s.token);
    emit_token(child, std::move(s), child.seq.tokens.size());
    if (!child.finished) sched->add_running(&child.seq);
  }
}

// One sampled token (already in c.seq.tokens, of which the first keep_tokens are emitted
// once it is): text, stop conditions, length. A finish drops the tokens after it.
void Engine::Impl::emit_token(Choice& c, SampleResult s, size_t keep_tokens) {
  ActiveRequest& r = *c.req;
  const Request& q = r.req;
  r.usage.completion_tokens += 1;
  {
    std::lock_guard<std::mutex> lock(stats_mu);
    stats.generated_tokens += 1;
  }
  const int32_t token = s.token;
  const bool grammar_done = s.grammar_done;
  TokenInfo info{token, s.logprob, std::move(s.top)};
  auto finish = [&](std::string text, FinishReason reason) {
    c.seq.tokens.resize(keep_tokens);
    emit_delta(c, std::move(text), {info});
    finish_choice(c, reason);
  };
  if (c.grammar_stuck) {
    c.seq.tokens.resize(keep_tokens - 1);
    finish_choice(c, FinishReason::kError, "the output's grammar allows no token the vocabulary has here");
    return;
  }

  const bool eog = !q.stop.ignore_eos && self->tokenizer_.is_eog(token);
  const bool stop_tok = std::find(q.stop.stop_token_ids.begin(), q.stop.stop_token_ids.end(), token) !=
                        q.stop.stop_token_ids.end();
  if (eog || stop_tok) {
    // The stop token itself is not text the user sees; release what the matcher held.
    std::string tail = c.detok->flush();
    bool matched = false;
    std::string text = c.stop->push(tail, &matched);
    if (!matched) text += c.stop->flush();
    finish(std::move(text), FinishReason::kStop);
    return;
  }
  bool matched = false;
  std::string text = c.stop->push(c.detok->push(token), &matched);
  if (matched) {
    finish(std::move(text), FinishReason::kStop);
    return;
  }
  const int generated = static_cast<int>(keep_tokens) - c.seq.n_prompt;
  const bool length = generated >= q.stop.max_tokens || static_cast<int>(keep_tokens) >= self->n_ctx_;
  // A complete grammar (nothing may follow) ends the text as a stop; the length bound as
  // length, unless a stop string completes in what the detokenizer still held.
  if (grammar_done || length) {
    std::string tail = c.detok->flush();
    bool m2 = false;
    text += c.stop->push(tail, &m2);
    if (!m2) text += c.stop->flush();
    finish(std::move(text), m2 || grammar_done ? FinishReason::kStop : FinishReason::kLength);
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
  if (tiers) e.tier = static_cast<int8_t>(c.tier);
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

void Engine::Impl::abort_request(ActiveRequest& r, const std::string& message, const std::string& code) {
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
      e.code = code;
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
  if (const int64_t first = r.choices[0]->seq.first_scheduled_ns; first > 0) {
    r.usage.queue_ns = std::max<int64_t>(0, first - r.arrival_ns);
  }
  if (shadow) offer_shadow(r);
  if (!r.aborting && r.req.kind == RequestKind::kGenerate && r.first_token_ns > 0) {
    std::lock_guard<std::mutex> lock(sink_mu);
    if (output_sink) output_sink(r.choices[0]->seq.tokens, r.choices[0]->seq.n_prompt);
  }
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

void Engine::Impl::publish_stats(double step_ms, int batch_tokens, int batch_seqs) {
  std::lock_guard<std::mutex> lock(stats_mu);
  refresh_gauges_locked();
  stats.steps += 1;
  stats.major_page_faults += step_faults;
  stats.step_seconds_total += step_ms * 1e-3;
  stats.last_step_ms = step_ms;
  stats.last_batch_tokens = batch_tokens;
  stats.last_batch_seqs = batch_seqs;
  observe(stats.step_ms_buckets, EngineStats::step_ms_bounds(), step_ms);
  observe(stats.batch_tokens_buckets, EngineStats::batch_tokens_bounds(), batch_tokens);
}

}  // namespace metro::engine
