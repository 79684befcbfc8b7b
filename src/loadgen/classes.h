// Request classes (SLA classes) and the mix in which a workload draws them.
//
//   --classes realtime:0.2,standard:0.3,batch:0.5
//
// Weights need not sum to 1; they are normalized. A class name is 1-64 characters of
// [A-Za-z0-9_.-] (it travels in the X-Metro-Class header). With no --classes, every request
// is in the class "default" and no header is sent.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "loadgen/rng.h"

namespace metro::loadgen {

inline constexpr std::string_view kDefaultClass = "default";

// Checks a class name for the header and the report.
Status validate_class_name(std::string_view name);

struct ClassMix {
  struct Entry {
    std::string name;
    double weight = 1.0;
  };
  std::vector<Entry> entries;  // empty: everything is kDefaultClass

  static Expected<ClassMix> parse(std::string_view spec);
  // One class name drawn by weight.
  const std::string& pick(Rng& rng) const;
  std::string to_string() const;
};

}  // namespace metro::loadgen
