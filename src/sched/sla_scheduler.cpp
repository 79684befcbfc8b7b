#include "sched/sla_scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "base/check.h"
#include "sched/sched_metrics.h"

namespace metro::sched {

namespace {

constexpr double kNsPerS = 1e9;
// Cached predictions are refreshed when the predictor has learnt this many new lengths.
constexpr uint64_t kPredictionRefresh = 32;
// ... and when the sequence has generated this many tokens since.
constexpr int kPredictionStride = 16;

// See the table in sla_scheduler.h. Smaller is served first.
struct Key {
  int tier = 1;
  int rank = 0;
  int cls = 0;
  int phase = 0;  // 0 decode, 1 prefill
  int level = 0;
  double share = 0.0;
  double work = 0.0;
  int64_t arrival = 0;
  uint64_t id = 0;

  bool operator<(const Key& o) const {
    return std::tie(tier, rank, cls, phase, level, share, work, arrival, id) <
           std::tie(o.tier, o.rank, o.cls, o.phase, o.level, o.share, o.work, o.arrival, o.id);
  }
};

struct Entry {
  SeqState* seq = nullptr;
  LengthFeatures features;
  bool running = false;
  int64_t ready_since_ns = -1;    // arrival or last scheduled; -1: stamp at next schedule()
  bool starving_prefill = false;  // sticky until the prompt (or its recompute) is done
  int n_charged_prompt = 0;       // prompt tokens already charged to the tenant's counter
  double pred_remaining = 0.0;    // cached LengthPredictor answer for pred_generated
  int pred_generated = -1;
  uint64_t pred_version = 0;
  // When the first token reached the client (the schedule() after the step that sampled it;
  // -1: not yet): the request's TPOT counts from here, see step_target_s.
  int64_t first_token_ns = -1;
  bool stamp_first_token = false;
  // Per step.
  Key key;
  bool defer = false;  // a decode ahead of its pace: after this step's prompts
  bool planned = false;
  bool preempted_now = false;
  bool tenant_front = false;  // the tenant's oldest starving prompt in its class
};

class SlaSchedulerImpl final : public SlaScheduler {
 public:
  SlaSchedulerImpl(const SlaSchedulerConfig& cfg, kv::KvCacheManager& kv)
      : cfg_(cfg), kv_(kv), vtc_(cfg.vtc), predictor_(cfg.predictor) {
    if (!predictor_) predictor_ = std::make_shared<BucketQuantilePredictor>();
    max_running_ = cfg_.max_running_seqs > 0 ? cfg_.max_running_seqs : cfg_.base.max_seqs;
    watermark_blocks_ = static_cast<int32_t>(std::ceil(cfg_.kv_watermark * kv_.config().n_blocks));
    last_seen_ns_.fill(std::numeric_limits<int64_t>::min());
    last_class_prefill_ns_.fill(std::numeric_limits<int64_t>::min() / 2);
  }

  void add(SeqState* seq) override {
    Entry& e = insert(seq);
    seq->status = SeqStatus::kWaiting;
    e.running = false;
  }

  void add_running(SeqState* seq) override {
    Entry& e = insert(seq);
    seq->status = SeqStatus::kRunning;
    seq->admit_order = ++admit_counter_;
    e.running = true;
    e.n_charged_prompt = std::min(seq->n_computed, seq->n_prompt);  // the sibling paid for it
    running_.push_back(&e);
  }

  StepPlan schedule(int64_t now_ns) override;
  using Scheduler::update;
  void update(const StepPlan& plan, const StepResult& result) override;

  void remove(SeqState* seq) override {
    kv_.free(seq->id);
    auto it = entries_.find(seq);
    if (it != entries_.end()) {
      vtc_.on_request_removed(seq->sla_class, seq->tenant);
      if (it->second.running) std::erase(running_, &it->second);
      entries_.erase(it);
      if (lane_ == seq) lane_ = nullptr;
    }
    seq->status = SeqStatus::kFinished;
  }

  void finish(SeqState* seq) override {
    auto it = entries_.find(seq);
    if (it != entries_.end()) {
      predictor_->observe(it->second.features, seq->n_generated());
      if (cfg_.metrics != nullptr && seq->predicted_output_tokens >= 0) {
        cfg_.metrics->observe_prediction(seq->sla_class, seq->predicted_output_tokens, seq->n_generated());
      }
    }
    remove(seq);
  }

  SchedulerCounts counts() const override {
    SchedulerCounts c;
    for (const auto& [seq, e] : entries_) {
      const size_t k = static_cast<size_t>(seq->sla_class);
      if (e.running) {
        ++c.running;
        ++c.running_by_class[k];
      } else {
        ++c.waiting;
        ++c.waiting_by_class[k];
      }
    }
    c.preemptions = preemptions_;
    return c;
  }

  const char* name() const override { return "sla"; }
  std::string describe() const override;

  double tenant_counter(SlaClass c, const std::string& tenant) const override {
    return vtc_.counter(c, tenant);
  }
  int level_of(const SeqState* seq) const override {
    auto it = entries_.find(seq);
    return it == entries_.end() ? -1 : level(*seq);
  }
  int last_step_budget() const override { return last_budget_; }
  const LengthPredictor& predictor() const override { return *predictor_; }

  void observe_step(const StepCostSample& sample) override {
    if (cost_tracker_.observe(sample)) cfg_.cost = cost_tracker_.model();
  }
  void set_step_scale(double scale) override {
    METRO_CHECK(scale > 0.0);
    step_scale_ = scale;
  }
  SchedulerStats stats() const override { return {counts(), last_budget_, cfg_.cost}; }
  std::shared_ptr<const QueueOrder> queue_order() const override { return queue_order_; }

 private:
  Entry& insert(SeqState* seq) {
    auto [it, fresh] = entries_.try_emplace(seq);
    METRO_CHECK(fresh);
    Entry& e = it->second;
    e.seq = seq;
    e.features = LengthFeatures::of(*seq);
    e.ready_since_ns = seq->arrival_ns > 0 ? seq->arrival_ns : -1;
    vtc_.on_request_added(seq->sla_class, seq->tenant);
    const int g = std::max(0, seq->n_generated());
    const LengthPrediction p = predictor_->predict(e.features, g);
    seq->predicted_output_tokens = g + static_cast<int>(std::lround(p.mean_remaining));
    return e;
  }

  static bool is_decode(const Entry& e) { return e.running && e.seq->n_uncomputed() <= 1; }

  // Skip-join MLFQ: the first level whose cumulative quantum the work done so far does not
  // exceed (a long prompt joins lower; more than a quantum of work drops a level).
  int level(const SeqState& s) const {
    const double q = cfg_.sla.of(s.sla_class).quantum_tokens;
    const double done = s.n_prompt * cfg_.prefill_token_cost + std::max(0, s.n_generated());
    int k = 0;
    double end = q;  // level k holds up to q * (2^(k+1) - 1)
    while (k + 1 < cfg_.levels && done > end) {
      ++k;
      end += q * std::ldexp(1.0, k);
    }
    return k;
  }

  double predicted_work(Entry& e) {
    const SeqState& s = *e.seq;
    const int g = std::max(0, s.n_generated());
    const uint64_t version = predictor_->version();
    if (e.pred_generated < 0 || g < e.pred_generated || g - e.pred_generated >= kPredictionStride ||
        version - e.pred_version >= kPredictionRefresh) {
      e.pred_remaining = predictor_->predict(e.features, g).mean_remaining;
      e.pred_generated = g;
      e.pred_version = version;
    }
    // Between refreshes a decode's remaining work counts down token by token.
    const double remaining = std::max(1.0, e.pred_remaining - (g - e.pred_generated));
    const int uncomputed = is_decode(e) ? 0 : s.n_uncomputed();
    return uncomputed * cfg_.prefill_token_cost + remaining;
  }

  double wait_s(const Entry& e, int64_t now_ns) const {
    return static_cast<double>(std::max<int64_t>(0, now_ns - e.ready_since_ns)) / kNsPerS;
  }

  // How many classes e's wait lifts it: a waiting prompt climbs through every class above
  // it within its starvation bound, a paused decode one class per TPOT objective it waited.
  int promotion(const Entry& e, int64_t now_ns) const {
    const int cls = static_cast<int>(e.seq->sla_class);
    if (cls == 0) return 0;
    const SlaClassConfig& cc = cfg_.sla.of(e.seq->sla_class);
    const double step_s = is_decode(e) ? cc.tpot_s : cc.starve_s / (cls + 1);
    return static_cast<int>(std::min(static_cast<double>(cls), std::floor(wait_s(e, now_ns) / step_s)));
  }

  Key key_of(Entry& e, int64_t now_ns, bool lane, int class_rank) {
    const SeqState& s = *e.seq;
    const bool decode = is_decode(e);
    Key k;
    k.arrival = s.arrival_ns;
    k.id = s.id;
    if (lane || (decode && wait_s(e, now_ns) >= cfg_.sla.of(s.sla_class).starve_s)) {
      k.tier = 0;
      return k;
    }
    // A paused decode climbs on its own (one token is cheap); prompts climb as a class, so
    // that aging reorders classes but not the shortest-first order inside one.
    k.rank = decode ? std::min(class_rank, static_cast<int>(s.sla_class) - promotion(e, now_ns)) : class_rank;
    k.cls = static_cast<int>(s.sla_class);
    k.phase = decode ? (e.defer ? 2 : 0) : 1;
    k.share = decode ? 0.0 : vtc_.counter(s.sla_class, s.tenant);
    if (e.tenant_front) {
      // Starved inside its class (shorter work kept arriving): the oldest such request of
      // each tenant goes first among that tenant's. One at a time, so shortest-first still
      // orders the rest, and fair share between tenants is untouched.
      k.level = 0;
      k.work = -wait_s(e, now_ns);
    } else {
      k.level = level(s);
      k.work = predicted_work(e);
    }
    return k;
  }

  // Seconds the next step may take: the tightest objective of the classes present, or
  // +infinity (no cost model, or no objective binds). `decode_allow` holds per class the
  // least time any of its running decodes allows (see decode_allowance_s).
  double step_target_s(int64_t now_ns, const std::array<double, kNumSlaClasses>& decode_allow,
                       int lowest_prompt_class) const {
    double target = std::numeric_limits<double>::infinity();
    if (!cfg_.cost.known()) return target;
    for (int c = 0; c < kNumSlaClasses; ++c) {
      const SlaClassConfig& cc = cfg_.sla.classes[static_cast<size_t>(c)];
      const int64_t seen = last_seen_ns_[static_cast<size_t>(c)];
      const bool present = seen != std::numeric_limits<int64_t>::min() &&
                           static_cast<double>(now_ns - seen) / kNsPerS <= cfg_.class_memory_s;
      if (present) target = std::min(target, cc.ttft_s * cfg_.step_per_ttft);
      if (cfg_.tpot_cap_own_class || lowest_prompt_class > c) {
        target = std::min(target, decode_allow[static_cast<size_t>(c)]);
      }
    }
    return target;
  }

  // How long the next step may take for decode e to keep its TPOT objective (a mean over the
  // request: (last token - first token) / (tokens - 1)). On pace that is step_per_tpot x TPOT;
  // with tpot_slack a request may spend what it banked against tpot_slack_share x TPOT (every
  // token at pace banks the margin between the two, every short step more), so a step can
  // carry more prompt while decodes have slack. Never less than the pace: a request behind
  // it does not take the step budget down to nothing.
  double pace_s(SlaClass c) const { return cfg_.sla.of(c).tpot_s * cfg_.step_per_tpot; }

  double decode_allowance_s(const Entry& e, int64_t now_ns) const {
    const double pace = pace_s(e.seq->sla_class);
    if (!cfg_.tpot_slack || e.first_token_ns < 0) return pace;
    // After this step the request has n_generated() + 1 tokens: its TPOT so far stays within
    // the share of its objective if the step ends by first token + share x TPOT x n_generated().
    const double mean = cfg_.tpot_slack_share * cfg_.sla.of(e.seq->sla_class).tpot_s;
    const double until =
        static_cast<double>(e.first_token_ns - now_ns) / kNsPerS + mean * std::max(1, e.seq->n_generated());
    return std::max(pace, until);
  }

  // Fair share of seats. VTC orders waiting prompts, but a prompt needs a seat, and a tenant
  // that flooded an idle server holds every seat for as long as its requests run: a quiet
  // tenant arriving then waits for the flood's requests to finish one by one, far from its
  // half of the tokens (docs/scheduling.md, scenario 4). When a class's seats are all taken,
  // a tenant with a waiting prompt and fewer than seats / active tenants of them takes one
  // from the tenant holding the most (above that share, served no less): its most
  // recent admission is preempted, and its blocks stay in the prefix cache, so coming back
  // costs little. One seat per waiting tenant per step; a tenant at or below its share is
  // never a victim, so two tenants cannot take turns.
  void rebalance_seats(StepPlan* plan) {
    for (int c = 0; c < kNumSlaClasses; ++c) {
      const SlaClass cls = static_cast<SlaClass>(c);
      auto& seats = tenant_seats_[static_cast<size_t>(c)];
      seats.clear();
      fair_seats_[static_cast<size_t>(c)] = 0;
      const int n_tenants = vtc_.n_active_tenants(cls);
      if (n_tenants < 2) continue;
      int taken = 0;
      for (const Entry* r : running_) {
        if (r->seq->sla_class <= cls) ++taken;
        if (r->seq->sla_class == cls) ++seats[r->seq->tenant].running;
      }
      if (taken < seats_) continue;
      for (const auto& [seq, e] : entries_) {
        if (seq->sla_class == cls && !e.running && e.key.tier != 0) seats[seq->tenant].waiting = true;
      }
      const int fair = std::max(1, seats_ / n_tenants);
      for (auto& [tenant, ts] : seats) {
        if (!ts.waiting || ts.running >= fair) continue;
        // Contested: until the next step, tenants at their share admit nothing new (a
        // freed seat must not go back to the flood's next prompt).
        fair_seats_[static_cast<size_t>(c)] = fair;
        const double mine = vtc_.counter(cls, std::string(tenant));
        // The tenant holding the most seats above the share, and its latest admission.
        std::string_view over;
        int most = fair;
        for (const auto& [t, o] : seats) {
          if (o.running > most && vtc_.counter(cls, std::string(t)) >= mine) {
            most = o.running;
            over = t;
          }
        }
        if (over.empty()) continue;
        Entry* victim = nullptr;
        for (Entry* r : running_) {
          if (r->seq->sla_class != cls || r->seq->tenant != over || r->key.tier == 0) continue;
          if (victim == nullptr || r->seq->admit_order > victim->seq->admit_order) victim = r;
        }
        if (victim == nullptr) continue;
        preempt(victim, plan, /*fair_share=*/true);
        --seats[over].running;
      }
    }
  }

  // Whether `e` may take v's blocks. Memory preemption throws work away, so it follows an
  // order that does not move while sequences wait (aging moves keys; ping-pong between two
  // sequences whose keys cross would livelock): for running sequences (native class,
  // admission order), so the oldest admission of the best class always progresses; a
  // waiting one may only take a lower class's blocks; the starvation lane takes any
  // blocks but a more senior lane's, and nothing takes the lane's.
  static bool may_preempt(const Entry& e, const Entry& v) {
    const SeqState& a = *e.seq;
    const SeqState& b = *v.seq;
    if (v.key.tier == 0) {
      return e.key.tier == 0 && std::tie(a.arrival_ns, a.id) < std::tie(b.arrival_ns, b.id);
    }
    if (e.key.tier == 0) return true;
    if (e.running) return std::tie(a.sla_class, a.admit_order) < std::tie(b.sla_class, b.admit_order);
    return b.sla_class > a.sla_class;
  }

  // The running sequence `e` takes blocks from: the lowest priority this step among those it
  // may preempt and that are not planned; null if none.
  Entry* victim_for(const Entry& e) const {
    Entry* best = nullptr;
    for (Entry* v : running_) {
      if (v == &e || v->planned || !may_preempt(e, *v)) continue;
      if (best == nullptr || best->key < v->key) best = v;
    }
    return best;
  }

  void preempt(Entry* v, StepPlan* plan, bool fair_share = false) {
    SeqState* s = v->seq;
    kv_.free(s->id);
    s->n_computed = 0;
    s->status = SeqStatus::kWaiting;
    ++s->n_preemptions;
    ++preemptions_;
    v->running = false;
    v->preempted_now = true;
    std::erase(running_, v);
    plan->preempted.push_back(s);
    if (cfg_.metrics != nullptr) cfg_.metrics->observe_preemption(s->sla_class, fair_share);
  }

  // Whether preempting every sequence e may preempt could free `blocks` (an upper bound:
  // blocks shared through the prefix cache do not come back); if not, nobody is preempted
  // for nothing.
  bool could_free(const Entry& e, int64_t blocks) const {
    int64_t avail = kv_.n_free_blocks();
    for (const Entry* v : running_) {
      if (avail >= blocks) break;
      if (v != &e && !v->planned && may_preempt(e, *v)) avail += kv_.n_held(v->seq->id);
    }
    return avail >= blocks;
  }

  // KV room for n more tokens of e, preempting what e may preempt.
  bool reserve(Entry* e, int n, StepPlan* plan) {
    if (!could_free(*e, blocks_for(kv_, *e->seq, n))) return false;
    while (!reserve_for(kv_, *e->seq, n)) {
      Entry* v = victim_for(*e);
      if (v == nullptr) return false;
      preempt(v, plan);
    }
    return true;
  }

  // Before a waiting sequence's first chunk: a seat among the running sequences of its
  // class and above, and KV for its whole remaining prompt, so that admitting it does not
  // leave half-prefilled sequences fighting over memory (each such fight is a preemption
  // that throws work away). Classes below realtime also leave `kv_watermark` of the blocks
  // free: headroom for running decodes to grow and for realtime arrivals.
  bool make_room_to_admit(Entry* e, StepPlan* plan) {
    const SeqState& s = *e->seq;
    auto seats_taken = [&] {
      int n = 0;
      for (const Entry* r : running_) n += r->seq->sla_class <= s.sla_class ? 1 : 0;
      return n;
    };
    // Headroom is for others: a starving request, or one alone, may use every block.
    const bool privileged = s.sla_class == SlaClass::kRealtime || e->key.tier == 0 || e->tenant_front;
    const int32_t headroom = privileged || running_.empty() ? 0 : watermark_blocks_;
    if (!could_free(*e, int64_t{kv_.blocks_needed(s.id, s.n_uncomputed())} + headroom)) return false;
    while (seats_taken() >= seats_ ||
           kv_.n_free_blocks() < kv_.blocks_needed(s.id, s.n_uncomputed()) + headroom) {
      Entry* v = victim_for(*e);
      if (v == nullptr) return false;
      preempt(v, plan);
    }
    return true;
  }

  SlaSchedulerConfig cfg_;
  kv::KvCacheManager& kv_;
  VirtualTokenCounter vtc_;
  std::shared_ptr<LengthPredictor> predictor_;
  StepCostTracker cost_tracker_;
  std::shared_ptr<const QueueOrder> queue_order_ = class_queue_order();
  std::unordered_map<const SeqState*, Entry> entries_;
  std::vector<Entry*> running_;
  const SeqState* lane_ = nullptr;  // the starvation lane's holder
  std::vector<Entry*> order_;
  std::array<std::unordered_map<std::string_view, Entry*>, kNumSlaClasses> tenant_front_;
  struct TenantSeats {
    int running = 0;
    bool waiting = false;  // has a prompt waiting to be admitted
  };
  // Per class, this step: running sequences and waiting prompts per tenant, and the seat
  // share while seats are contested (0: they are not).
  std::array<std::unordered_map<std::string_view, TenantSeats>, kNumSlaClasses> tenant_seats_;
  std::array<int, kNumSlaClasses> fair_seats_{};
  std::array<int64_t, kNumSlaClasses> last_seen_ns_{};
  // Last step that prefilled a prompt of the class outside the lane.
  std::array<int64_t, kNumSlaClasses> last_class_prefill_ns_{};
  int max_running_ = 0;
  int seats_ = 0;  // this step's running cap: max_running_, cut to a share of a small budget
  int32_t watermark_blocks_ = 0;
  int last_budget_ = 0;
  double step_scale_ = 1.0;  // set_step_scale()
  uint64_t admit_counter_ = 0;
  uint64_t preemptions_ = 0;
};

std::string SlaSchedulerImpl::describe() const {
  std::string out;
  char line[320];
  const StepCostModel& c = cfg_.cost;
  std::snprintf(line, sizeof line,
                "sla: %zu sequences, %zu running, seats %d, budget %d, kv free %d of %d blocks (watermark %d); "
                "cost fixed %.3g s, prefill %.3g s/token, decode %.3g s + %.3g s/key\n",
                entries_.size(), running_.size(), seats_, last_budget_, static_cast<int>(kv_.n_free_blocks()),
                static_cast<int>(kv_.config().n_blocks), watermark_blocks_, c.fixed_s, c.per_prefill_token_s,
                c.per_decode_seq_s, c.per_decode_ctx_s);
  out += line;
  for (const auto& [seq, e] : entries_) {
    std::snprintf(line, sizeof line,
                  "  seq %llu class %d tenant '%.32s' %s: computed %d of %d (prompt %d, draft %zu), blocks %zu, "
                  "preemptions %d, key tier %d rank %d phase %d%s%s%s\n",
                  static_cast<unsigned long long>(seq->id), static_cast<int>(seq->sla_class), seq->tenant.c_str(),
                  e.running ? "running" : "waiting", seq->n_computed, static_cast<int>(seq->tokens.size()),
                  seq->n_prompt, seq->draft.size(), kv_.has(seq->id) ? kv_.table(seq->id).size() : size_t{0},
                  seq->n_preemptions, e.key.tier, e.key.rank, e.key.phase, e.starving_prefill ? ", starving" : "",
                  e.tenant_front ? ", tenant front" : "", seq == lane_ ? ", lane" : "");
    out += line;
  }
  return out;
}

StepPlan SlaSchedulerImpl::schedule(int64_t now_ns) {
  StepPlan plan;
  std::array<double, kNumSlaClasses> decode_allow;
  decode_allow.fill(std::numeric_limits<double>::infinity());
  int lowest_prompt_class = -1;  // the lowest class with prompt work (-1: none)
  // The lane stays with its holder until its prompt is done: handing it to an older
  // request that starts starving meanwhile would throw the holder's progress away.
  Entry* lane = nullptr;
  if (lane_ != nullptr) {
    auto it = entries_.find(lane_);
    // Until it samples: a recompute's last token looks like a decode but is still the lane's.
    if (it != entries_.end() && it->second.starving_prefill) lane = &it->second;
  }
  const bool lane_held = lane != nullptr;
  // Per-step scratch lives in members so that steady-state steps do not allocate.
  std::vector<Entry*>& order = order_;
  order.clear();
  std::array<int, kNumSlaClasses> promoted{};
  int best_class = kNumSlaClasses;
  for (const auto& [seq, e] : entries_) best_class = std::min(best_class, static_cast<int>(seq->sla_class));
  auto& tenant_front = tenant_front_;
  for (auto& m : tenant_front) m.clear();
  for (auto& [seq, e] : entries_) {
    if (e.ready_since_ns < 0) e.ready_since_ns = now_ns;
    if (e.stamp_first_token) {
      e.first_token_ns = now_ns;
      e.stamp_first_token = false;
    }
    e.planned = false;
    e.defer = false;
    e.preempted_now = false;
    e.tenant_front = false;
    const size_t cls = static_cast<size_t>(seq->sla_class);
    last_seen_ns_[cls] = now_ns;
    if (!is_decode(e)) promoted[cls] = std::max(promoted[cls], promotion(e, now_ns));
    if (is_decode(e)) {
      // A decode two paces ahead can sit out one step and still keep its pace in the next:
      // it yields to prompts (ordered after them), and the step ends early enough for it.
      const double allow = decode_allowance_s(e, now_ns);
      const double pace = pace_s(seq->sla_class);
      e.defer = cfg_.cost.known() && allow >= 2.0 * pace;  // never without tpot_slack: allow == pace
      decode_allow[cls] = std::min(decode_allow[cls], e.defer ? allow - pace : allow);
    } else {
      lowest_prompt_class = std::max(lowest_prompt_class, static_cast<int>(cls));
      if (wait_s(e, now_ns) >= cfg_.sla.of(seq->sla_class).starve_s) e.starving_prefill = true;
      // The lane is for requests that higher classes starve: a higher class has work and
      // this class's prompts have not been served for its whole starve time. A class that is
      // served but has more than it can take starves by its own backlog; there the oldest
      // request of each tenant goes first (see key_of) and fair share still applies.
      const bool class_starved =
          static_cast<double>(now_ns - last_class_prefill_ns_[cls]) / kNsPerS >= cfg_.sla.of(seq->sla_class).starve_s;
      if (e.starving_prefill && !lane_held && static_cast<int>(cls) > best_class && class_starved &&
          (lane == nullptr || std::tie(seq->arrival_ns, seq->id) < std::tie(lane->seq->arrival_ns, lane->seq->id))) {
        lane = &e;
      }
      if (wait_s(e, now_ns) >= cfg_.sla.of(seq->sla_class).starve_s * cfg_.in_class_starve_factor) {
        Entry*& front = tenant_front[cls][seq->tenant];
        if (front == nullptr || std::tie(seq->arrival_ns, seq->id) < std::tie(front->seq->arrival_ns, front->seq->id)) {
          front = &e;
        }
      }
    }
    order.push_back(&e);
  }
  for (auto& by_tenant : tenant_front) {
    for (auto& [tenant, e] : by_tenant) e->tenant_front = true;
  }
  lane_ = lane != nullptr ? lane->seq : nullptr;
  for (Entry* e : order) {
    const size_t cls = static_cast<size_t>(e->seq->sla_class);
    e->key = key_of(*e, now_ns, e == lane, static_cast<int>(cls) - promoted[cls]);
  }

  // The step's budget is time when the engine has fed a cost model and an objective binds:
  // a decode costs decode_s(its context), a prompt chunk prefill_s(n, its position) (on a
  // CPU a decode costs two or three prompt tokens: attention over its context, the LM head,
  // sampling). Counting every token at the dearer of the two would halve prefill throughput
  // near saturation (steps of half the tokens the objective allows).
  const int budget_total =
      std::max(1, static_cast<int>(std::floor(cfg_.base.max_batch_tokens * std::min(1.0, step_scale_))));
  const double target_s = step_target_s(now_ns, decode_allow, lowest_prompt_class) * step_scale_;
  const bool timed = std::isfinite(target_s);
  const StepCostModel& cost = cfg_.cost;
  const double per_prefill = std::max(cost.per_prefill_token_s, 1e-9);
  // What a decode costs now: the mean over the running decodes (their contexts), for the
  // seat count; a decode of an empty context when none runs.
  double decode_sum = 0.0;
  int n_decodes = 0;
  for (const Entry* e : running_) {
    if (!is_decode(*e)) continue;
    decode_sum += cost.decode_s(e->seq->n_computed);
    ++n_decodes;
  }
  const double per_decode = n_decodes > 0 ? decode_sum / n_decodes : cost.decode_s(0);
  // Never below min_step_tokens of prompt or one decode: a step must make progress.
  const double time_total =
      timed ? std::max({target_s - cost.fixed_s, std::min(cfg_.min_step_tokens, budget_total) * per_prefill,
                        per_decode})
            : std::numeric_limits<double>::infinity();
  double time_left = time_total;
  last_budget_ = timed ? static_cast<int>(std::min<double>(budget_total, std::floor(time_total / per_prefill)))
                       : budget_total;
  // Decodes go first, so seats beyond a share of the budget would leave prompts none.
  const double decode_room = timed ? time_total * cfg_.decode_share / std::max(per_decode, per_prefill)
                                   : budget_total * cfg_.decode_share;
  seats_ = std::min(max_running_, std::max(1, static_cast<int>(std::min<double>(decode_room, budget_total))));
  const int lane_cap = std::max(1, static_cast<int>(cfg_.starving_prefill_share *
                                                    std::min<double>(budget_total, time_total / per_prefill)));
  rebalance_seats(&plan);
  int budget = budget_total;
  int logits = 0;
  bool hold_admissions = false;
  bool realtime_prefill = false;

  auto later = [](const Entry* a, const Entry* b) { return b->key < a->key; };
  std::make_heap(order.begin(), order.end(), later);
  while (!order.empty() && budget > 0 && time_left > 0.0 &&
         static_cast<int>(plan.seqs.size()) < cfg_.base.max_seqs) {
    std::pop_heap(order.begin(), order.end(), later);
    Entry* e = order.back();
    order.pop_back();
    if (e->preempted_now) continue;  // lost its blocks this step; it runs again later
    SeqState* s = e->seq;
    if (realtime_prefill && e->key.tier != 0 && s->sla_class != SlaClass::kRealtime) continue;
    const bool was_running = e->running;
    if (!was_running && !kv_.has(s->id)) {
      const std::span<const int32_t> lookup = s->use_prefix_cache ? std::span<const int32_t>(s->tokens)
                                                                 : std::span<const int32_t>();
      const int cached = kv_.computed_blocks(s->id, lookup, s->cache_scope);
      s->n_computed = cached;
      if (s->n_preemptions == 0) s->n_cached_prompt = std::min(cached, s->n_prompt);
    }
    int n = std::min(s->n_to_compute(), budget);
    if (e->key.tier == 0 && !is_decode(*e)) n = std::min(n, lane_cap);
    const bool decode = is_decode(*e);
    // A decode with drafts computes them too: each costs about a prompt token.
    auto decode_cost_of = [&](int k) {
      return cost.decode_s(s->n_computed) + (k > 1 ? cost.prefill_s(k - 1, s->n_computed + 1) : 0.0);
    };
    if (timed && decode) {
      while (n > 1 && decode_cost_of(n) > time_left) --n;
    }
    // Each draft wants a row of logits: drafts give way before the decode does.
    if (decode && n > 1) n = std::max(1, std::min(n, cfg_.base.max_logits - logits));
    const double decode_cost = decode ? decode_cost_of(n) : 0.0;
    if (timed) {
      // A paused decode keeps its blocks: its token would push the step past the objective.
      // Never the step's first work: a step makes progress (time_total covers a decode at
      // the running decodes' mean cost, which a longer context, or the rounding of a mean of
      // equal costs, can exceed; with every decode paused nothing would change again).
      if (decode && decode_cost > time_left && !plan.seqs.empty()) continue;
      if (!decode) {
        // A step makes progress: the first work of a step is never cut below
        // min_step_tokens, even where attention over a long context makes them dear.
        const int fit = cost.max_prefill(time_left, s->n_computed, n);
        n = plan.seqs.empty() ? std::max(fit, std::min(n, cfg_.min_step_tokens)) : fit;
      }
    }
    if (s->cuts_whole_prompt(n)) {
      // All of it or none: all when it would be the step's first work and fits the token
      // budget (a step makes progress), else it waits for a step with room.
      n = plan.seqs.empty() && s->n_uncomputed() <= budget ? s->n_uncomputed() : 0;
    }
    const ScheduledSeq entry = n > 0 ? plan_entry(s, n) : ScheduledSeq{};
    const int rows = entry.logit_rows();
    const size_t cls_i = static_cast<size_t>(s->sla_class);
    const bool at_share = !was_running && fair_seats_[cls_i] > 0 &&
                          tenant_seats_[cls_i][s->tenant].running >= fair_seats_[cls_i];
    if (!was_running && (hold_admissions || at_share)) {
      kv_.free(s->id);
      s->n_computed = 0;
      continue;
    }
    bool fits = n > 0 && !(rows > 0 && logits + rows > cfg_.base.max_logits);
    if (fits && !was_running) {
      fits = make_room_to_admit(e, &plan);
      // Smaller requests behind a starving one that does not fit would take the memory it
      // waits for, forever if they keep coming: admit nothing after it until it fits.
      if (!fits && e->tenant_front) hold_admissions = true;
    }
    fits = fits && reserve(e, n, &plan);
    if (!fits) {
      if (!was_running) {
        // Give prefix hits back so the cached blocks stay evictable while it waits.
        kv_.free(s->id);
        s->n_computed = 0;
      }
      continue;  // a running sequence is paused: it keeps its blocks
    }
    if (!was_running) {
      e->running = true;
      s->status = SeqStatus::kRunning;
      s->admit_order = ++admit_counter_;
      if (s->first_scheduled_ns == 0) s->first_scheduled_ns = now_ns;
      running_.push_back(e);
      if (fair_seats_[cls_i] > 0) ++tenant_seats_[cls_i][s->tenant].running;
    }
    e->planned = true;
    e->ready_since_ns = now_ns;
    plan.seqs.push_back(entry);
    if (!is_decode(*e) && e->key.tier != 0) last_class_prefill_ns_[static_cast<size_t>(s->sla_class)] = now_ns;
    budget -= n;
    if (timed) time_left -= decode ? decode_cost : cost.prefill_s(n, s->n_computed);
    logits += rows;
    // Every token in the step delays its end, so a step that prefills a realtime prompt
    // carries nothing of the classes below (their decodes pause for those few steps).
    if (cfg_.realtime_prefill_exclusive && s->sla_class == SlaClass::kRealtime && !is_decode(*e)) {
      realtime_prefill = true;
    }
  }
  plan.n_tokens = budget_total - budget;
  return plan;
}

void SlaSchedulerImpl::update(const StepPlan& plan, const StepResult& result) {
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq& ss = plan.seqs[i];
    SeqState* s = ss.seq;
    const bool sampled = ss.samples();
    advance_computed(kv_, ss, i < result.n_accepted.size() ? result.n_accepted[i] : 0);
    auto it = entries_.find(s);
    if (it == entries_.end()) continue;
    Entry& e = it->second;
    // Charge the tenant for new prompt tokens and for each sampled token; recomputation
    // after a preemption is the scheduler's doing, not the tenant's.
    const int prompt_done = std::min(s->n_computed, s->n_prompt);
    const int new_prompt = std::max(0, prompt_done - e.n_charged_prompt);
    e.n_charged_prompt = std::max(e.n_charged_prompt, prompt_done);
    vtc_.charge(s->sla_class, s->tenant, new_prompt, sampled ? 1 : 0);
    if (sampled) {
      e.starving_prefill = false;
      if (e.first_token_ns < 0) e.stamp_first_token = true;
    }
  }
}

}  // namespace

Status validate(const SlaSchedulerConfig& cfg) {
  auto bad = [](const std::string& what) { return invalid_argument("scheduler config: " + what); };
  auto finite_nonneg = [](double v) { return std::isfinite(v) && v >= 0.0; };
  if (cfg.base.max_batch_tokens < 1) return bad("max_batch_tokens must be >= 1");
  if (cfg.base.max_seqs < 1) return bad("max_seqs must be >= 1");
  if (cfg.base.max_logits < 1) return bad("max_logits must be >= 1");
  if (cfg.levels < 1 || cfg.levels > 16) return bad("levels must be in [1, 16]");
  if (!finite_nonneg(cfg.prefill_token_cost) || cfg.prefill_token_cost > 1000.0) {
    return bad("prefill_token_cost must be in [0, 1000]");
  }
  if (cfg.max_running_seqs < 0) return bad("max_running_seqs must be >= 0 (0: max_seqs)");
  if (!(cfg.kv_watermark >= 0.0 && cfg.kv_watermark < 1.0)) return bad("kv_watermark must be in [0, 1)");
  if (!(cfg.starving_prefill_share > 0.0 && cfg.starving_prefill_share <= 1.0)) {
    return bad("starving_prefill_share must be in (0, 1]");
  }
  if (!finite_nonneg(cfg.vtc.prompt) || !finite_nonneg(cfg.vtc.output)) return bad("VTC weights must be >= 0");
  if (!finite_nonneg(cfg.cost.fixed_s) || !finite_nonneg(cfg.cost.per_prefill_token_s) ||
      !finite_nonneg(cfg.cost.per_decode_seq_s)) {
    return bad("step cost terms must be finite and >= 0");
  }
  if (!(cfg.step_per_ttft > 0.0 && cfg.step_per_ttft <= 1.0)) return bad("step_per_ttft must be in (0, 1]");
  if (!(cfg.step_per_tpot > 0.0 && cfg.step_per_tpot <= 1.0)) return bad("step_per_tpot must be in (0, 1]");
  if (!(cfg.tpot_slack_share >= cfg.step_per_tpot && cfg.tpot_slack_share <= 1.0)) {
    return bad("tpot_slack_share must be in [step_per_tpot, 1]");
  }
  if (!(cfg.decode_share > 0.0 && cfg.decode_share <= 1.0)) return bad("decode_share must be in (0, 1]");
  if (!(std::isfinite(cfg.in_class_starve_factor) && cfg.in_class_starve_factor >= 1.0)) {
    return bad("in_class_starve_factor must be >= 1");
  }
  if (!finite_nonneg(cfg.class_memory_s)) return bad("class_memory_s must be >= 0");
  if (cfg.min_step_tokens < 1) return bad("min_step_tokens must be >= 1");
  for (int c = 0; c < kNumSlaClasses; ++c) {
    const SlaClassConfig& cc = cfg.sla.classes[static_cast<size_t>(c)];
    const std::string name = sla_class_name(static_cast<SlaClass>(c));
    auto ok = [](double s) { return std::isfinite(s) && s > 0.0 && s <= kMaxSloSeconds; };
    if (!ok(cc.ttft_s) || !ok(cc.tpot_s) || !ok(cc.starve_s)) {
      return bad(name + ": ttft, tpot and starve must be finite, > 0 and <= 86400 s");
    }
    if (cc.quantum_tokens < 1 || cc.quantum_tokens > kMaxQuantumTokens) {
      return bad(name + ": quantum must be in [1, 1000000]");
    }
  }
  return Status();
}

std::unique_ptr<SlaScheduler> make_sla_scheduler(const SlaSchedulerConfig& cfg, kv::KvCacheManager& kv) {
  METRO_CHECK_MSG(validate(cfg).ok(), "make_sla_scheduler: invalid config (call validate())");
  return std::make_unique<SlaSchedulerImpl>(cfg, kv);
}

}  // namespace metro::sched
