#include "sched/fair_share.h"

#include <algorithm>

#include "base/check.h"

namespace metro::sched {

bool VirtualTokenCounter::min_active(const Map& m, const std::string* except, double* out) const {
  bool any = false;
  for (const auto& [name, t] : m) {
    if (t.active <= 0 || (except != nullptr && name == *except)) continue;
    *out = any ? std::min(*out, t.counter) : t.counter;
    any = true;
  }
  return any;
}

void VirtualTokenCounter::on_request_added(SlaClass c, const std::string& tenant) {
  Map& m = cls(c);
  Tenant& t = m[tenant];
  if (t.active++ == 0) {
    double lift = 0.0;
    if (min_active(m, &tenant, &lift)) t.counter = std::max(t.counter, lift);
  }
  if (m.size() > kPruneAbove) prune(m);
}

void VirtualTokenCounter::on_request_removed(SlaClass c, const std::string& tenant) {
  Map& m = cls(c);
  auto it = m.find(tenant);
  METRO_CHECK(it != m.end() && it->second.active > 0);
  --it->second.active;
}

void VirtualTokenCounter::charge(SlaClass c, const std::string& tenant, int prompt_tokens,
                                 int output_tokens) {
  Map& m = cls(c);
  auto it = m.find(tenant);
  if (it == m.end()) return;
  it->second.counter += w_.prompt * prompt_tokens + w_.output * output_tokens;
}

double VirtualTokenCounter::counter(SlaClass c, const std::string& tenant) const {
  const Map& m = cls(c);
  auto it = m.find(tenant);
  return it == m.end() ? 0.0 : it->second.counter;
}

int VirtualTokenCounter::active_requests(SlaClass c, const std::string& tenant) const {
  const Map& m = cls(c);
  auto it = m.find(tenant);
  return it == m.end() ? 0 : it->second.active;
}

int VirtualTokenCounter::n_active_tenants(SlaClass c) const {
  int n = 0;
  for (const auto& [name, t] : cls(c)) n += t.active > 0 ? 1 : 0;
  return n;
}

// An idle tenant whose counter is at or below the least active counter would be lifted to
// that minimum if it returned while the class is busy, so forgetting it loses nothing that
// matters for fairness and keeps the table bounded.
void VirtualTokenCounter::prune(Map& m) {
  double floor = 0.0;
  if (!min_active(m, nullptr, &floor)) return;
  std::erase_if(m, [&](const auto& kv) { return kv.second.active == 0 && kv.second.counter <= floor; });
}

}  // namespace metro::sched
