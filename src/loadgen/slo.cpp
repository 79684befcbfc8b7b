#include "loadgen/slo.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "loadgen/classes.h"

namespace metro::loadgen {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

Expected<double> parse_seconds(std::string_view text, std::string_view item) {
  std::string_view num = text;
  double unit = 1.0;
  if (num.ends_with("ms")) {
    unit = 1e-3;
    num.remove_suffix(2);
  } else if (num.ends_with("s")) {
    num.remove_suffix(1);
  }
  std::string tmp(num);
  char* end = nullptr;
  double v = std::strtod(tmp.c_str(), &end);
  if (tmp.empty() || end != tmp.c_str() + tmp.size() || !(v > 0.0) || !std::isfinite(v)) {
    return invalid_argument("--slo '" + std::string(item) + "': '" + std::string(text) +
                            "' is not a positive duration (seconds, or with an s/ms suffix)");
  }
  return v * unit;
}

bool within(double measured, const std::optional<double>& limit) {
  if (!limit) return true;
  if (std::isnan(measured)) return true;  // nothing to judge: see slo.h
  return measured <= *limit;
}

}  // namespace

std::string Slo::to_string() const {
  std::string s;
  auto add = [&](const char* name, const std::optional<double>& v) {
    if (!v) return;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%s%s<=%gs", s.empty() ? "" : " ", name, *v);
    s += buf;
  };
  add("ttft", ttft_s);
  add("tpot", tpot_s);
  add("itl", itl_s);
  add("e2e", e2e_s);
  return s.empty() ? "none" : s;
}

bool Slo::met_by(const RequestRecord& r) const {
  if (!r.ok()) return false;
  return within(r.ttft_s, ttft_s) && within(r.tpot_s, tpot_s) && within(r.max_itl_s(), itl_s) &&
         within(r.e2e_s, e2e_s);
}

Expected<SloSet> SloSet::parse(const std::vector<std::string>& specs) {
  SloSet set;
  std::vector<std::string_view> groups;
  for (const auto& spec : specs) {
    std::string_view rest = spec;
    for (;;) {
      auto semi = rest.find(';');
      groups.push_back(trim(rest.substr(0, semi)));
      if (semi == std::string_view::npos) break;
      rest.remove_prefix(semi + 1);
    }
  }
  for (std::string_view group : groups) {
    if (group.empty()) continue;
    Slo* target = &set.all_;
    std::string_view rest = group;
    for (;;) {
      auto comma = rest.find(',');
      std::string_view item = trim(rest.substr(0, comma));
      if (item.empty()) return invalid_argument("--slo '" + std::string(group) + "': empty item");
      if (auto colon = item.find(':'); colon != std::string_view::npos) {
        std::string_view cls = trim(item.substr(0, colon));
        if (Status st = validate_class_name(cls); !st.ok()) {
          return invalid_argument("--slo '" + std::string(group) + "': " + st.message());
        }
        target = &set.per_class_[std::string(cls)];
        item = trim(item.substr(colon + 1));
      }
      auto eq = item.find('=');
      if (eq == std::string_view::npos) {
        return invalid_argument("--slo '" + std::string(item) +
                                "': expected METRIC=SECONDS with METRIC one of ttft, tpot, itl, e2e");
      }
      std::string_view metric = trim(item.substr(0, eq));
      METRO_ASSIGN_OR_RETURN(double v, parse_seconds(trim(item.substr(eq + 1)), item));
      if (metric == "ttft") {
        target->ttft_s = v;
      } else if (metric == "tpot") {
        target->tpot_s = v;
      } else if (metric == "itl") {
        target->itl_s = v;
      } else if (metric == "e2e") {
        target->e2e_s = v;
      } else {
        return invalid_argument("--slo: unknown metric '" + std::string(metric) +
                                "' (use ttft, tpot, itl or e2e)");
      }
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  return set;
}

bool SloSet::any() const {
  if (!all_.empty()) return true;
  for (const auto& [name, slo] : per_class_) {
    if (!slo.empty()) return true;
  }
  return false;
}

Slo SloSet::for_class(std::string_view class_name) const {
  Slo s = all_;
  auto it = per_class_.find(class_name);
  if (it == per_class_.end()) return s;
  const Slo& c = it->second;
  if (c.ttft_s) s.ttft_s = c.ttft_s;
  if (c.tpot_s) s.tpot_s = c.tpot_s;
  if (c.itl_s) s.itl_s = c.itl_s;
  if (c.e2e_s) s.e2e_s = c.e2e_s;
  return s;
}

}  // namespace metro::loadgen
