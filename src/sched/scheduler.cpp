#include "sched/scheduler.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>

#include "base/check.h"
#include "sched/sla_scheduler.h"

namespace metro::sched {

ScheduledSeq plan_entry(SeqState* s, int n) {
  METRO_CHECK(n > 0 && n <= s->n_to_compute());
  ScheduledSeq e;
  e.seq = s;
  e.n_tokens = n;
  e.n_draft = std::max(0, n - s->n_uncomputed());
  e.sample = n - e.n_draft == s->n_uncomputed();
  return e;
}

void advance_computed(kv::KvCacheManager& kv, const ScheduledSeq& e, int n_accepted) {
  METRO_CHECK(n_accepted >= 0 && n_accepted <= e.n_draft);
  SeqState* s = e.seq;
  s->n_computed += e.n_tokens - e.n_draft + n_accepted;
  METRO_CHECK(s->n_computed <= static_cast<int>(s->tokens.size()));
  if (n_accepted < e.n_draft) kv.truncate(s->id, s->n_computed);
  kv.commit(s->id, s->tokens, s->n_computed);
}

int32_t blocks_for(const kv::KvCacheManager& kv, const SeqState& s, int n) {
  const int drafts = std::max(0, n - s.n_uncomputed());
  return kv.blocks_needed(s.id, n - drafts, drafts);
}

bool reserve_for(kv::KvCacheManager& kv, const SeqState& s, int n) {
  const int drafts = std::max(0, n - s.n_uncomputed());
  return kv.allocate(s.id, n - drafts, drafts).has_value();
}

namespace {

Status unknown_option(std::string_view policy, std::string_view key) {
  return invalid_argument("--sched " + std::string(policy) + " has no option '" + std::string(key) + "'");
}

Status bad_value(std::string_view key, std::string_view value, std::string_view allowed) {
  return invalid_argument("scheduler option " + std::string(key) + "='" + std::string(value) + "': expected " +
                          std::string(allowed));
}

Expected<double> number(std::string_view key, std::string_view value) {
  double v = 0.0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || !std::isfinite(v)) {
    return bad_value(key, value, "a number");
  }
  return v;
}

Expected<bool> on_off(std::string_view key, std::string_view value, std::string_view on, std::string_view off) {
  if (value == on) return true;
  if (value == off) return false;
  return bad_value(key, value, std::string(on) + " or " + std::string(off));
}

// The SLA policy's options: key -> how it sets the config.
using Setter = std::function<Status(SlaSchedulerConfig&, std::string_view key, std::string_view value)>;

Setter number_into(double SlaSchedulerConfig::*field) {
  return [field](SlaSchedulerConfig& c, std::string_view k, std::string_view v) -> Status {
    METRO_ASSIGN_OR_RETURN(double x, number(k, v));
    c.*field = x;
    return Status();
  };
}

Setter integer_into(int SlaSchedulerConfig::*field) {
  return [field](SlaSchedulerConfig& c, std::string_view k, std::string_view v) -> Status {
    METRO_ASSIGN_OR_RETURN(double x, number(k, v));
    if (x != std::floor(x) || std::fabs(x) > 1e9) return bad_value(k, v, "a whole number");
    c.*field = static_cast<int>(x);
    return Status();
  };
}

Setter flag_into(bool SlaSchedulerConfig::*field, std::string_view on, std::string_view off) {
  return [field, on, off](SlaSchedulerConfig& c, std::string_view k, std::string_view v) -> Status {
    METRO_ASSIGN_OR_RETURN(bool b, on_off(k, v, on, off));
    c.*field = b;
    return Status();
  };
}

const std::vector<std::pair<std::string_view, Setter>>& sla_options() {
  static const std::vector<std::pair<std::string_view, Setter>> table = {
      {"tpot_slack", flag_into(&SlaSchedulerConfig::tpot_slack, "on", "off")},
      {"tpot_cap", flag_into(&SlaSchedulerConfig::tpot_cap_own_class, "all", "lower")},
      {"decode_share", number_into(&SlaSchedulerConfig::decode_share)},
      {"levels", integer_into(&SlaSchedulerConfig::levels)},
      {"prefill_token_cost", number_into(&SlaSchedulerConfig::prefill_token_cost)},
      {"max_running_seqs", integer_into(&SlaSchedulerConfig::max_running_seqs)},
      {"kv_watermark", number_into(&SlaSchedulerConfig::kv_watermark)},
      {"step_per_ttft", number_into(&SlaSchedulerConfig::step_per_ttft)},
      {"step_per_tpot", number_into(&SlaSchedulerConfig::step_per_tpot)},
      {"min_step_tokens", integer_into(&SlaSchedulerConfig::min_step_tokens)},
      {"realtime_prefill_exclusive", flag_into(&SlaSchedulerConfig::realtime_prefill_exclusive, "on", "off")},
  };
  return table;
}

Expected<SlaSchedulerConfig> sla_config_of(const SchedulerOptions& o) {
  SlaSchedulerConfig c;
  c.base = o.base;
  c.sla = o.objectives;
  c.metrics = o.metrics;
  for (const auto& kv : o.policy) {
    const std::string& key = kv.first;
    const std::string& value = kv.second;
    const auto& table = sla_options();
    auto it = std::find_if(table.begin(), table.end(), [&](const auto& e) { return e.first == key; });
    if (it == table.end()) return unknown_option("sla", key);
    METRO_RETURN_IF_ERROR(it->second(c, key, value));
  }
  METRO_RETURN_IF_ERROR(validate(c));
  return c;
}

Status check_fcfs(const SchedulerOptions& o) {
  if (!o.policy.empty()) return unknown_option("fcfs", o.policy.front().first);
  if (o.base.max_batch_tokens < 1 || o.base.max_seqs < 1 || o.base.max_logits < 1) {
    return invalid_argument("scheduler: max_batch_tokens, max_seqs and max_logits must be >= 1");
  }
  return Status();
}

Status unknown_policy(std::string_view name) {
  return invalid_argument("--sched: unknown scheduler '" + std::string(name) + "'; expected fcfs or sla");
}

}  // namespace

const std::vector<std::string>& scheduler_names() {
  static const std::vector<std::string> names = {"sla", "fcfs"};
  return names;
}

Status check_scheduler_options(std::string_view name, const SchedulerOptions& options) {
  if (name == "fcfs") return check_fcfs(options);
  if (name == "sla") return sla_config_of(options).status();
  return unknown_policy(name);
}

Expected<std::unique_ptr<Scheduler>> make_scheduler(std::string_view name, const SchedulerOptions& options,
                                                    kv::KvCacheManager& kv) {
  if (name == "fcfs") {
    METRO_RETURN_IF_ERROR(check_fcfs(options));
    return make_fcfs_scheduler(options.base, kv);
  }
  if (name == "sla") {
    METRO_ASSIGN_OR_RETURN(SlaSchedulerConfig c, sla_config_of(options));
    return std::unique_ptr<Scheduler>(make_sla_scheduler(c, kv));
  }
  return unknown_policy(name);
}

}  // namespace metro::sched
