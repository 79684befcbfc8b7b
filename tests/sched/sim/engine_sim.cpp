#include "sched/sim/engine_sim.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_map>

#include "base/check.h"
#include "base/hash.h"

namespace metro::sched::sim {

namespace {

constexpr double kNs = 1e9;

int64_t to_ns(double s) { return static_cast<int64_t>(std::llround(s * kNs)); }

// Token ids that never collide between requests, so the prefix cache sees no false hits.
int32_t token_id(size_t req, size_t pos) {
  return static_cast<int32_t>(hash_combine(mix64(req + 1), pos) & 0x3fffffff);
}

struct Live {
  size_t idx = 0;
  std::unique_ptr<SeqState> seq;
  bool admitted_by_gateway = false;
  bool released_queue = false;
  int64_t admitted_ns = 0;
  int64_t quota_charge = 0;
  double first_token_at = -1.0;
  int charged_prompt = 0;  // prompt tokens already counted as served
  int high_water = 0;      // most tokens ever computed (recomputation stays below it)
};

}  // namespace

SimReport run_sim(const std::vector<TraceRequest>& trace, const SimConfig& cfg, const SchedulerFactory& make) {
  SimReport rep;
  rep.outcomes.resize(trace.size());
  kv::KvCacheManager kv({.n_blocks = cfg.kv_blocks, .block_size = cfg.block_size});
  std::unique_ptr<Scheduler> sched = make(kv);

  std::set<std::string> tenants;
  for (const TraceRequest& t : trace) tenants.insert(t.tenant);

  std::unordered_map<const SeqState*, std::unique_ptr<Live>> live;  // unfinished admitted requests
  size_t next = 0;
  double now = trace.empty() ? 0.0 : trace.front().arrival_s;
  const double start = now;
  double last_finish = now;

  auto fail = [&](const std::string& what) {
    if (rep.invariant_error.empty()) rep.invariant_error = what;
  };

  auto arrive = [&](size_t i) {
    const TraceRequest& t = trace[i];
    RequestOutcome& out = rep.outcomes[i];
    const int64_t now_ns = to_ns(now);
    auto l = std::make_unique<Live>();
    l->idx = i;
    if (cfg.quota != nullptr) {
      l->quota_charge = t.prompt_tokens + t.max_tokens;
      gateway::Decision d = cfg.quota->admit(t.tenant, l->quota_charge, now_ns);
      if (!d.admit) {
        out = {.rejected = true, .http_status = d.http_status, .reason = d.reason, .retry_after_s = d.retry_after_s};
        return;
      }
    }
    if (cfg.admission != nullptr) {
      gateway::Decision d = cfg.admission->admit(t.sla_class, t.prompt_tokens, "", t.deadline_ns, now_ns);
      if (!d.admit) {
        if (cfg.quota != nullptr) cfg.quota->release(t.tenant, l->quota_charge, 0, 0.0, now_ns);
        out = {.rejected = true, .http_status = d.http_status, .reason = d.reason, .retry_after_s = d.retry_after_s};
        return;
      }
      l->admitted_by_gateway = true;
      l->admitted_ns = now_ns;
    }
    auto s = std::make_unique<SeqState>();
    s->id = i + 1;
    s->tokens.resize(static_cast<size_t>(t.prompt_tokens));
    for (size_t p = 0; p < s->tokens.size(); ++p) s->tokens[p] = token_id(i, p);
    s->n_prompt = t.prompt_tokens;
    s->max_new_tokens = t.max_tokens;
    s->arrival_ns = to_ns(t.arrival_s);
    s->sla_class = t.sla_class;
    s->tenant = t.tenant;
    s->deadline_ns = t.deadline_ns;
    s->prefix_hash = t.prefix_hash;
    l->seq = std::move(s);
    SeqState* raw = l->seq.get();
    live.emplace(raw, std::move(l));
    sched->add(raw);
  };

  while ((next < trace.size() || !live.empty()) && rep.steps < cfg.max_steps && now - start < cfg.max_sim_s) {
    while (next < trace.size() && trace[next].arrival_s <= now) arrive(next++);
    if (live.empty()) {
      if (next < trace.size()) now = std::max(now, trace[next].arrival_s);
      continue;
    }
    // Is every tenant backlogged (a request waiting) at the start of the step?
    bool all_backlogged = false;
    if (tenants.size() > 1) {
      std::set<std::string> waiting;
      for (auto it = live.begin(); it != live.end() && waiting.size() < tenants.size(); ++it) {
        if (it->first->status == SeqStatus::kWaiting) waiting.insert(it->first->tenant);
      }
      all_backlogged = waiting.size() == tenants.size();
    }

    bool prompt_work = false;
    for (auto it = live.begin(); it != live.end() && !prompt_work; ++it) {
      prompt_work = it->first->status == SeqStatus::kWaiting || it->first->n_computed < it->first->n_prompt;
    }

    const int64_t now_ns = to_ns(now);
    const SchedulerCounts waiting_before = cfg.admission != nullptr ? sched->counts() : SchedulerCounts{};
    StepPlan plan = sched->schedule(now_ns);
    if (plan.empty()) {
      if (next < trace.size()) {
        now = std::max(now, trace[next].arrival_s);
        continue;
      }
      rep.deadlock = true;
      break;
    }
    ++rep.steps;
    rep.preemptions += plan.preempted.size();

    int64_t prefill_tokens = 0, attended = 0, decode_keys = 0;
    std::array<int, kNumSlaClasses> class_prefill{};
    int decode_seqs = 0;
    std::vector<bool> samples(plan.seqs.size());
    std::map<std::string, double> served;
    for (size_t k = 0; k < plan.seqs.size(); ++k) {
      const ScheduledSeq& ss = plan.seqs[k];
      const SeqState* s = ss.seq;
      samples[k] = ss.samples();
      if (cfg.check_invariants) {
        if (kv.n_slots(s->id) < s->n_computed + ss.n_tokens) fail("scheduled tokens without KV slots");
        if (ss.n_tokens <= 0) fail("empty chunk in plan");
        if (s->status != SeqStatus::kRunning) fail("planned sequence not running");
        for (const SeqState* v : plan.preempted) {
          if (v == s) fail("preempted sequence also planned");
        }
      }
      const bool decode = ss.n_tokens == 1 && samples[k] && s->n_generated() > 0 && s->n_computed > 0;
      if (decode) {
        ++decode_seqs;
      } else {
        prefill_tokens += ss.n_tokens;
        class_prefill[static_cast<size_t>(s->sla_class)] += ss.n_tokens;
      }
      const int64_t n = ss.n_tokens, c = s->n_computed;
      if (decode) {
        decode_keys += c + 1;
      } else {
        attended += static_cast<int64_t>(StepCostModel::pairs(n, c));
      }
    }
    if (cfg.check_invariants) {
      if (plan.n_tokens > 0 && plan.n_tokens != [&] {
            int t = 0;
            for (const auto& ss : plan.seqs) t += ss.n_tokens;
            return t;
          }()) {
        fail("plan.n_tokens does not match its chunks");
      }
      for (const SeqState* v : plan.preempted) {
        if (kv.n_slots(v->id) != 0 || v->n_computed != 0) fail("preempted sequence kept KV");
      }
    }
    // Account served tokens: prompt the first time it is computed, output when sampled.
    for (size_t k = 0; k < plan.seqs.size(); ++k) {
      const ScheduledSeq& ss = plan.seqs[k];
      auto found = live.find(ss.seq);
      METRO_CHECK(found != live.end());
      Live* l = found->second.get();
      const int end = ss.seq->n_computed + ss.n_tokens;
      const int prompt_done = std::min(end, ss.seq->n_prompt);
      const int fresh_prompt = std::max(0, prompt_done - l->charged_prompt);
      l->charged_prompt = std::max(l->charged_prompt, prompt_done);
      rep.prompt_tokens += fresh_prompt;
      rep.recomputed_tokens += std::max(0, std::min(end, l->high_water) - ss.seq->n_computed);
      l->high_water = std::max(l->high_water, end);
      served[ss.seq->tenant] += fresh_prompt + (samples[k] ? 1 : 0);
    }

    const double dt = cfg.cost.step_s(prefill_tokens, decode_seqs, attended, decode_keys);
    sched->update(plan);
    now += dt;
    rep.busy_s += dt;
    if (prompt_work) {
      SimReport::Split& b = rep.prompt_backlog;
      ++b.steps;
      b.s += dt;
      b.fixed_s += cfg.cost.fixed_s;
      b.decode_s += cfg.cost.per_decode_seq_s * decode_seqs + cfg.cost.per_decode_key_s * static_cast<double>(decode_keys);
      b.prefill_s += cfg.cost.per_prefill_token_s * static_cast<double>(prefill_tokens) +
                     cfg.cost.per_attended_pair_s * static_cast<double>(attended);
    }
    if (all_backlogged) rep.backlogged_s += dt;
    for (auto& [tenant, n] : served) {
      rep.tokens_by_tenant[tenant] += n;
      if (all_backlogged) rep.tokens_when_all_backlogged[tenant] += n;
    }
    if (cfg.admission != nullptr) {
      gateway::StepObservation o;
      o.step_s = dt;
      o.prefill_s = dt * static_cast<double>(prefill_tokens) / static_cast<double>(prefill_tokens + decode_seqs);
      o.prefill_tokens = class_prefill;
      for (size_t k = 0; k < o.backlogged.size(); ++k) o.backlogged[k] = waiting_before.waiting_by_class[k] > 0;
      cfg.admission->observe_step(o);
    }

    // Sample: append a token for every chunk that reached its sequence's end.
    for (size_t k = 0; k < plan.seqs.size(); ++k) {
      if (!samples[k]) continue;
      SeqState* s = plan.seqs[k].seq;
      auto it = live.find(s);
      METRO_CHECK(it != live.end());
      Live& l = *it->second;
      const TraceRequest& t = trace[l.idx];
      RequestOutcome& out = rep.outcomes[l.idx];
      s->tokens.push_back(token_id(l.idx, s->tokens.size()));
      ++rep.output_tokens;
      if (l.first_token_at < 0.0) {
        l.first_token_at = now;
        out.ttft_s = now - t.arrival_s;
        if (cfg.metrics != nullptr) cfg.metrics->observe_first_token(t.sla_class, out.ttft_s);
        if (l.admitted_by_gateway && !l.released_queue) {
          cfg.admission->release(t.sla_class, t.prompt_tokens, "", l.admitted_ns);
          l.released_queue = true;
        }
      }
      const int target = std::min(t.output_tokens, t.max_tokens);
      if (s->n_generated() >= target) {
        out.finished = true;
        out.generated = s->n_generated();
        out.preemptions = s->n_preemptions;
        out.e2e_s = now - t.arrival_s;
        out.tpot_s = out.generated >= 2 ? (now - l.first_token_at) / (out.generated - 1) : -1.0;
        if (cfg.metrics != nullptr) cfg.metrics->observe_finished(t.sla_class, out.ttft_s, out.tpot_s, out.e2e_s);
        if (cfg.quota != nullptr) {
          cfg.quota->release(t.tenant, l.quota_charge, t.prompt_tokens + out.generated, out.e2e_s, to_ns(now));
        }
        sched->finish(s);
        last_finish = now;
        live.erase(it);
      }
    }
    if (cfg.metrics != nullptr) {
      const SchedulerCounts c = sched->counts();
      for (int k = 0; k < kNumSlaClasses; ++k) {
        cfg.metrics->set_queue_depth(static_cast<SlaClass>(k), c.waiting_by_class[static_cast<size_t>(k)],
                                     c.running_by_class[static_cast<size_t>(k)]);
      }
    }
  }
  rep.makespan_s = last_finish - start;
  return rep;
}

LatencySummary summarize(const std::vector<double>& values) {
  LatencySummary s;
  std::vector<double> v;
  for (double x : values) {
    if (x >= 0.0) v.push_back(x);
  }
  s.n = static_cast<int>(v.size());
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0.0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  auto q = [&](double p) {
    const size_t i = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size()))) - 1;
    return v[std::min(i, v.size() - 1)];
  };
  s.p50 = q(0.50);
  s.p90 = q(0.90);
  s.p99 = q(0.99);
  s.max = v.back();
  return s;
}

std::vector<double> ttfts(const std::vector<TraceRequest>& trace, const SimReport& r, int cls) {
  std::vector<double> out;
  for (size_t i = 0; i < trace.size(); ++i) {
    if (cls >= 0 && static_cast<int>(trace[i].sla_class) != cls) continue;
    if (r.outcomes[i].finished) out.push_back(r.outcomes[i].ttft_s);
  }
  return out;
}

std::vector<double> tpots(const std::vector<TraceRequest>& trace, const SimReport& r, int cls) {
  std::vector<double> out;
  for (size_t i = 0; i < trace.size(); ++i) {
    if (cls >= 0 && static_cast<int>(trace[i].sla_class) != cls) continue;
    if (r.outcomes[i].finished && r.outcomes[i].tpot_s >= 0.0) out.push_back(r.outcomes[i].tpot_s);
  }
  return out;
}

int count_slo_met(const std::vector<TraceRequest>& trace, const SimReport& r, const SlaConfig& sla, int cls) {
  int n = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    if (cls >= 0 && static_cast<int>(trace[i].sla_class) != cls) continue;
    const RequestOutcome& o = r.outcomes[i];
    if (!o.finished) continue;
    const SlaClassConfig& c = sla.of(trace[i].sla_class);
    if (o.ttft_s <= c.ttft_s && (o.tpot_s < 0.0 || o.tpot_s <= c.tpot_s)) ++n;
  }
  return n;
}

uint64_t SimRng::next() {
  s_ += 0x9e3779b97f4a7c15ull;
  return mix64(s_);
}

double SimRng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

int SimRng::uniform_int(int lo, int hi) {
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int>(next() % span);
}

double SimRng::exponential(double rate) { return -std::log(1.0 - uniform()) / rate; }

}  // namespace metro::sched::sim
