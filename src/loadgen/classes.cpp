#include "loadgen/classes.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace metro::loadgen {

Status validate_class_name(std::string_view name) {
  if (name.empty() || name.size() > 64) {
    return invalid_argument("class name '" + std::string(name) + "' must be 1-64 characters");
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) {
      return invalid_argument("class name '" + std::string(name) +
                              "' may hold only letters, digits, '_', '-' and '.'");
    }
  }
  return Status::ok_status();
}

Expected<ClassMix> ClassMix::parse(std::string_view spec) {
  ClassMix mix;
  if (spec.empty()) return mix;
  for (size_t start = 0; start <= spec.size();) {
    size_t comma = spec.find(',', start);
    if (comma == std::string_view::npos) comma = spec.size();
    std::string_view item = spec.substr(start, comma - start);
    start = comma + 1;
    Entry e;
    auto colon = item.find(':');
    e.name = std::string(item.substr(0, colon));
    METRO_RETURN_IF_ERROR(validate_class_name(e.name));
    if (colon != std::string_view::npos) {
      std::string w(item.substr(colon + 1));
      char* end = nullptr;
      e.weight = std::strtod(w.c_str(), &end);
      if (w.empty() || end != w.c_str() + w.size() || !(e.weight > 0.0) || !std::isfinite(e.weight)) {
        return invalid_argument("--classes: weight '" + w + "' of class '" + e.name +
                                "' is not a positive number");
      }
    }
    for (const auto& prev : mix.entries) {
      if (prev.name == e.name) return invalid_argument("--classes: class '" + e.name + "' given twice");
    }
    mix.entries.push_back(std::move(e));
  }
  return mix;
}

const std::string& ClassMix::pick(Rng& rng) const {
  static const std::string kDefault(kDefaultClass);
  if (entries.empty()) return kDefault;
  double total = 0.0;
  for (const auto& e : entries) total += e.weight;
  double x = rng.uniform01() * total;
  for (const auto& e : entries) {
    if (x < e.weight) return e.name;
    x -= e.weight;
  }
  return entries.back().name;
}

std::string ClassMix::to_string() const {
  std::string s;
  for (const auto& e : entries) {
    if (!s.empty()) s += ',';
    char buf[32];
    std::snprintf(buf, sizeof(buf), ":%g", e.weight);
    s += e.name + buf;
  }
  return s;
}

}  // namespace metro::loadgen
