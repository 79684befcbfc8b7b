#include "cli/tier_flags.h"

#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "model/requantize.h"

namespace metro::cli {

namespace {

struct TierSource {
  enum class Kind { kModel, kFormat, kPlan, kFile } kind = Kind::kModel;
  kernels::DType type = kernels::DType::kF32;
  std::string path;
};

bool ends_with(const std::string& s, const char* suffix) {
  const std::string x(suffix);
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

Expected<TierSource> parse_source(const std::string& v, const std::string& tier) {
  TierSource s;
  if (v.empty()) return invalid_argument("--tiers: " + tier + "= needs a value");
  if (v == "model") return s;
  if (model::is_quant_format_name(v)) {
    METRO_ASSIGN_OR_RETURN(s.type, model::quant_format_named(v, "--tiers " + tier));
    if (s.type == model::kKeepFormat) return s;  // keep: the model as it is
    s.kind = TierSource::Kind::kFormat;
    return s;
  }
  s.path = v;
  s.kind = ends_with(v, ".json") ? TierSource::Kind::kPlan : TierSource::Kind::kFile;
  return s;
}

// The comma-separated items of a flag's value ("" is one empty item).
std::vector<std::string> split_items(const std::string& spec) {
  std::vector<std::string> items;
  size_t pos = 0;
  for (;;) {
    const size_t comma = spec.find(',', pos);
    items.push_back(spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) return items;
    pos = comma + 1;
  }
}

// "high=SRC,low=SRC" (either may be left out, not both).
Expected<std::pair<TierSource, TierSource>> parse_tiers(const std::string& spec) {
  std::pair<TierSource, TierSource> out;
  bool seen[2] = {false, false};
  for (const std::string& item : split_items(spec)) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) return invalid_argument("--tiers takes high=SRC,low=SRC, got '" + item + "'");
    const std::string name = item.substr(0, eq);
    engine::adaptive::Tier t;
    if (!engine::adaptive::parse_tier(name, &t)) {
      return invalid_argument("--tiers: unknown tier '" + name + "' (the tiers are high and low)");
    }
    const size_t ti = static_cast<size_t>(t);
    if (seen[ti]) return invalid_argument("--tiers: " + name + " is given twice");
    seen[ti] = true;
    METRO_ASSIGN_OR_RETURN(TierSource src, parse_source(item.substr(eq + 1), name));
    (t == engine::adaptive::Tier::kHigh ? out.first : out.second) = std::move(src);
  }
  if (out.first.kind == TierSource::Kind::kModel && out.second.kind == TierSource::Kind::kModel) {
    return invalid_argument("--tiers: the two tiers are the same model; name a format, a plan or a file for one");
  }
  return out;
}

Expected<std::shared_ptr<const model::Model>> make_tier(const TierSource& src, const char* tier,
                                                        const std::shared_ptr<const model::Model>& loaded,
                                                        bool allow_repack) {
  if (src.kind == TierSource::Kind::kModel) return loaded;
  model::ModelOptions opts;
  opts.allow_repack = allow_repack;
  opts.backend = loaded->backend();
  if (src.kind == TierSource::Kind::kFile) {
    METRO_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m, model::Model::load(src.path, opts));
    return std::shared_ptr<const model::Model>(std::move(m));
  }
  model::QuantPlan plan;
  if (src.kind == TierSource::Kind::kPlan) {
    METRO_ASSIGN_OR_RETURN(plan, model::read_quant_plan(src.path, std::string("--tiers ") + tier));
  } else {
    plan.type = src.type;
  }
  Stopwatch sw;
  model::RequantizeReport rep;
  METRO_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, model::requantize(loaded->file(), plan, {}, &rep));
  METRO_ASSIGN_OR_RETURN(gguf::File file, gguf::File::copy_of(bytes));
  bytes = {};
  METRO_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m, model::Model::from_file(std::move(file), opts));
  std::fprintf(stderr, "metro serve: %s tier derived from the model in %.1f s (%.1f MiB)\n", tier, sw.elapsed_s(),
               static_cast<double>(rep.bytes) / (1 << 20));
  return std::shared_ptr<const model::Model>(std::move(m));
}

// "MODE=SCALE[,MODE=SCALE...]" over the controller's load modes; modes left out keep theirs.
Status parse_batch_budget(const std::string& spec, engine::adaptive::TierControllerConfig* cfg) {
  for (const std::string& item : split_items(spec)) {
    const size_t eq = item.find('=');
    engine::adaptive::LoadMode mode;
    if (eq == std::string::npos || !engine::adaptive::parse_load_mode(item.substr(0, eq), &mode)) {
      return invalid_argument("--tier-batch-budget takes MODE=SCALE (MODE: low_latency, normal, high_load), got '" +
                              item + "'");
    }
    const std::string v = item.substr(eq + 1);
    char* end = nullptr;
    const double x = v.empty() ? 0.0 : std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || !(x >= 0.25 && x <= 4.0)) {
      return invalid_argument("--tier-batch-budget: " + item.substr(0, eq) + " needs a scale in [0.25, 4], got '" +
                              v + "'");
    }
    cfg->step_scale[static_cast<size_t>(mode)] = x;
  }
  return {};
}

}  // namespace

void add_tier_flags(CLI::App& app, TierFlags& f) {
  app.add_option("--tiers", f.tiers,
                 "precision tiers high=SRC,low=SRC; SRC: model (the -m file), a format (q8_0, q4_0, q3_k, ...) or a "
                 "plan (.json) derived from it, or another GGUF file");
  app.add_option("--tier-policy", f.policy, "which tier requests not pinned to one run in: auto, high or low")
      ->capture_default_str();
  app.add_option("--tier-shadow-every", f.shadow_every, "score one of N low-tier outputs with both tiers (0: off)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("--tier-kl-max", f.kl_max, "mean shadow KL (nats) past which the high tier comes back")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  app.add_option("--tier-drift-max", f.drift_max,
                 "a layer's mean activation drift from the high tier past which the high tier comes back")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  app.add_option("--tier-cooldown", f.cooldown_s, "seconds the high tier holds after a rollback")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  app.add_option("--tier-switches-per-min", f.switches_per_min, "most tier switches in any minute")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--tier-pin-realtime", f.pin_realtime,
                 "on: realtime requests always run in the high tier; off: they follow the load")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--tier-batch-budget", f.batch_budget,
                 "the factor each load mode scales the scheduler's step length by, "
                 "MODE=SCALE,... (MODE: low_latency, normal, high_load; SCALE in [0.25, 4]; default 1 each)");
  app.add_option("--tier-admission-margin", f.admission_margin,
                 "at high load admission refuses a request predicted later than this many "
                 "times its class's TTFT objective, when below --ttft-margin (0: no change at high load)")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
}

Status check_tier_flags(const TierFlags& f) {
  engine::adaptive::TierPolicy p;
  if (!engine::adaptive::parse_tier_policy(f.policy, &p)) {
    return invalid_argument("--tier-policy must be auto, high or low");
  }
  if (!f.tiers.empty()) METRO_RETURN_IF_ERROR(parse_tiers(f.tiers).status());
  if (!f.batch_budget.empty()) {
    engine::adaptive::TierControllerConfig scratch;
    METRO_RETURN_IF_ERROR(parse_batch_budget(f.batch_budget, &scratch));
  }
  return {};
}

Expected<TierModels> build_tiers(const TierFlags& f, const std::shared_ptr<const model::Model>& loaded,
                                 bool allow_repack, engine::EngineConfig& config) {
  TierModels out;
  out.high = loaded;
  if (f.tiers.empty()) return out;
  METRO_RETURN_IF_ERROR(check_tier_flags(f));
  METRO_ASSIGN_OR_RETURN(auto sources, parse_tiers(f.tiers));
  METRO_ASSIGN_OR_RETURN(out.high, make_tier(sources.first, "high", loaded, allow_repack));
  METRO_ASSIGN_OR_RETURN(out.low, make_tier(sources.second, "low", loaded, allow_repack));
  config.low_tier = out.low;
  engine::adaptive::parse_tier_policy(f.policy, &config.tier_control.policy);
  config.tier_control.rollback_cooldown_s = f.cooldown_s;
  config.tier_control.max_switches_per_minute = f.switches_per_min;
  config.shadow.every = f.shadow_every;
  config.shadow.kl_max = f.kl_max;
  config.shadow.drift_max = f.drift_max;
  config.tier_control.pin_realtime = f.pin_realtime == "on";
  if (!f.batch_budget.empty()) METRO_RETURN_IF_ERROR(parse_batch_budget(f.batch_budget, &config.tier_control));
  config.tier_control.high_load_ttft_margin = f.admission_margin;
  return out;
}

}  // namespace metro::cli
