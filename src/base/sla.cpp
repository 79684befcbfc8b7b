#include "base/sla.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <vector>

namespace metro {

const char* sla_class_name(SlaClass c) {
  switch (c) {
    case SlaClass::kRealtime: return "realtime";
    case SlaClass::kStandard: return "standard";
    case SlaClass::kBatch: return "batch";
  }
  return "standard";
}

bool parse_sla_class(const std::string& s, SlaClass* out) {
  if (s == "realtime") *out = SlaClass::kRealtime;
  else if (s == "standard") *out = SlaClass::kStandard;
  else if (s == "batch") *out = SlaClass::kBatch;
  else return false;
  return true;
}

namespace {

std::string quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

std::vector<std::string_view> split_clauses(std::string_view spec) {
  std::vector<std::string_view> out;
  size_t i = 0;
  auto is_sep = [](char c) { return c == ' ' || c == '\t' || c == ';' || c == '\n'; };
  while (i < spec.size()) {
    while (i < spec.size() && is_sep(spec[i])) ++i;
    size_t j = i;
    while (j < spec.size() && !is_sep(spec[j])) ++j;
    if (j > i) out.push_back(spec.substr(i, j - i));
    i = j;
  }
  return out;
}

// "0.5", "500ms", "2s" -> seconds.
Expected<double> parse_seconds(std::string_view key, std::string_view value, std::string_view clause) {
  std::string_view num = value;
  double scale = 1.0;
  if (num.size() > 2 && num.substr(num.size() - 2) == "ms") {
    num.remove_suffix(2);
    scale = 1e-3;
  } else if (num.size() > 1 && num.back() == 's') {
    num.remove_suffix(1);
  }
  double v = 0.0;
  // from_chars refuses a leading '+', "inf" is refused below, "nan" fails isfinite.
  auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
  if (ec != std::errc() || end != num.data() + num.size() || num.empty()) {
    return invalid_argument("--sla: " + std::string(key) + "=" + std::string(value) + " in " +
                            quoted(clause) + ": " + quoted(value) +
                            " is not a number of seconds (e.g. 0.5, 2s, 500ms)");
  }
  v *= scale;
  if (!std::isfinite(v) || v <= 0.0 || v > kMaxSloSeconds) {
    return out_of_range("--sla: " + std::string(key) + "=" + std::string(value) + " in " +
                        quoted(clause) + ": seconds must be finite, > 0 and <= 86400");
  }
  return v;
}

Expected<int> parse_tokens(std::string_view key, std::string_view value, std::string_view clause) {
  long long v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || value.empty()) {
    return invalid_argument("--sla: " + std::string(key) + "=" + std::string(value) + " in " +
                            quoted(clause) + ": " + quoted(value) + " is not a whole number");
  }
  if (v < 1 || v > kMaxQuantumTokens) {
    return out_of_range("--sla: " + std::string(key) + "=" + std::string(value) + " in " +
                        quoted(clause) + ": tokens must be in [1, 1000000]");
  }
  return static_cast<int>(v);
}

Status parse_clause(std::string_view clause, SlaConfig* cfg, std::array<bool, kNumSlaClasses>* seen) {
  const size_t colon = clause.find(':');
  if (colon == std::string_view::npos) {
    return invalid_argument("--sla: " + quoted(clause) +
                            " is not a clause; expected CLASS:key=value,... "
                            "(e.g. realtime:ttft=0.5,tpot=0.1)");
  }
  const std::string_view cls_name = clause.substr(0, colon);
  SlaClass cls;
  if (!parse_sla_class(std::string(cls_name), &cls)) {
    return invalid_argument("--sla: unknown class " + quoted(cls_name) + " in " + quoted(clause) +
                            "; classes are realtime, standard, batch");
  }
  auto& once = (*seen)[static_cast<size_t>(cls)];
  if (once) return invalid_argument("--sla: class " + quoted(cls_name) + " appears twice");
  once = true;

  SlaClassConfig& c = cfg->of(cls);
  std::string_view rest = clause.substr(colon + 1);
  if (rest.empty()) {
    return invalid_argument("--sla: " + quoted(clause) + " names no setting; expected key=value");
  }
  bool ttft_set = false, tpot_set = false, starve_set = false, quantum_set = false;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (comma != std::string_view::npos && rest.empty()) {
      return invalid_argument("--sla: trailing ',' in " + quoted(clause));
    }
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size()) {
      return invalid_argument("--sla: bad setting " + quoted(item) + " in " + quoted(clause) +
                              "; expected key=value with key ttft, tpot, starve or quantum");
    }
    const std::string_view key = item.substr(0, eq);
    const std::string_view value = item.substr(eq + 1);
    auto dup = [&](bool* flag) -> Status {
      if (*flag) return invalid_argument("--sla: " + quoted(key) + " set twice in " + quoted(clause));
      *flag = true;
      return Status();
    };
    if (key == "ttft") {
      METRO_RETURN_IF_ERROR(dup(&ttft_set));
      METRO_ASSIGN_OR_RETURN(c.ttft_s, parse_seconds(key, value, clause));
    } else if (key == "tpot") {
      METRO_RETURN_IF_ERROR(dup(&tpot_set));
      METRO_ASSIGN_OR_RETURN(c.tpot_s, parse_seconds(key, value, clause));
    } else if (key == "starve") {
      METRO_RETURN_IF_ERROR(dup(&starve_set));
      METRO_ASSIGN_OR_RETURN(c.starve_s, parse_seconds(key, value, clause));
      c.starve_explicit = true;
    } else if (key == "quantum") {
      METRO_RETURN_IF_ERROR(dup(&quantum_set));
      METRO_ASSIGN_OR_RETURN(c.quantum_tokens, parse_tokens(key, value, clause));
    } else {
      return invalid_argument("--sla: unknown key " + quoted(key) + " in " + quoted(clause) +
                              "; keys are ttft, tpot, starve (seconds) and quantum (tokens)");
    }
  }
  if (!c.starve_explicit) c.starve_s = std::min(kMaxSloSeconds, kStarvePerTtft * c.ttft_s);
  return Status();
}

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", s);
  return buf;
}

}  // namespace

std::array<SlaClassConfig, kNumSlaClasses> SlaConfig::default_classes() {
  std::array<SlaClassConfig, kNumSlaClasses> c;
  c[0] = {.ttft_s = 0.5, .tpot_s = 0.1, .starve_s = 2.0, .starve_explicit = false, .quantum_tokens = 256};
  c[1] = {.ttft_s = 2.0, .tpot_s = 0.2, .starve_s = 8.0, .starve_explicit = false, .quantum_tokens = 1024};
  c[2] = {.ttft_s = 30.0, .tpot_s = 1.0, .starve_s = 120.0, .starve_explicit = false, .quantum_tokens = 4096};
  return c;
}

Expected<SlaConfig> parse_sla_spec(std::string_view spec) { return parse_sla_spec(spec, SlaConfig{}); }

Expected<SlaConfig> parse_sla_spec(std::string_view spec, const SlaConfig& base) {
  SlaConfig cfg = base;
  std::array<bool, kNumSlaClasses> seen{};
  for (std::string_view clause : split_clauses(spec)) {
    METRO_RETURN_IF_ERROR(parse_clause(clause, &cfg, &seen));
  }
  return cfg;
}

std::string format_sla_spec(const SlaConfig& cfg) {
  std::string out;
  for (int i = 0; i < kNumSlaClasses; ++i) {
    const SlaClassConfig& c = cfg.classes[static_cast<size_t>(i)];
    if (!out.empty()) out += ' ';
    out += sla_class_name(static_cast<SlaClass>(i));
    out += ":ttft=" + format_seconds(c.ttft_s) + ",tpot=" + format_seconds(c.tpot_s);
    if (c.starve_explicit) out += ",starve=" + format_seconds(c.starve_s);
    out += ",quantum=" + std::to_string(c.quantum_tokens);
  }
  return out;
}

}  // namespace metro
