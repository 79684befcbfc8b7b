// Fair share between tenants inside an SLA class: a virtual token counter (VTC, Sheng et
// al., "Fairness in Serving Large Language Models", OSDI 2024).
//
// Each (class, tenant) has a counter of the service it received: prompt tokens computed
// times `prompt` plus output tokens times `output`. The scheduler admits the waiting work of
// the tenant with the lowest counter first, so a tenant that floods the queue only competes
// with its own requests once its counter is ahead. A tenant that becomes active (its first
// unfinished request in the class) has its counter lifted to at least the least counter
// among the class's active tenants: time spent idle banks no credit.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "sched/seq_state.h"

namespace metro::sched {

struct VtcWeights {
  double prompt = 1.0;  // per prompt token computed
  double output = 2.0;  // per output token generated (the paper's default ratio)
};

class VirtualTokenCounter {
 public:
  explicit VirtualTokenCounter(VtcWeights w = {}) : w_(w) {}

  void on_request_added(SlaClass c, const std::string& tenant);
  void on_request_removed(SlaClass c, const std::string& tenant);
  void charge(SlaClass c, const std::string& tenant, int prompt_tokens, int output_tokens);

  double counter(SlaClass c, const std::string& tenant) const;
  int active_requests(SlaClass c, const std::string& tenant) const;
  int n_active_tenants(SlaClass c) const;
  size_t n_tracked(SlaClass c) const { return cls(c).size(); }

 private:
  struct Tenant {
    double counter = 0.0;
    int active = 0;  // unfinished requests in the class
  };
  using Map = std::unordered_map<std::string, Tenant>;
  Map& cls(SlaClass c) { return by_class_[static_cast<size_t>(c)]; }
  const Map& cls(SlaClass c) const { return by_class_[static_cast<size_t>(c)]; }
  // Least counter among active tenants other than `except`; false when there is none.
  bool min_active(const Map& m, const std::string* except, double* out) const;
  void prune(Map& m);

  static constexpr size_t kPruneAbove = 1024;

  VtcWeights w_;
  std::array<Map, kNumSlaClasses> by_class_;
};

}  // namespace metro::sched
