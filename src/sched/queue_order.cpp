#include "sched/queue_order.h"

#include <algorithm>

namespace metro::sched {

void PromptQueue::add(int prompt_tokens) {
  const int n = std::max(0, prompt_tokens);
  ++requests;
  tokens += n;
  ++lengths[n];
}

void PromptQueue::remove(int prompt_tokens) {
  const int n = std::max(0, prompt_tokens);
  requests = std::max(0, requests - 1);
  tokens = std::max<int64_t>(0, tokens - n);
  auto it = lengths.find(n);
  if (it != lengths.end() && --it->second == 0) lengths.erase(it);
  if (requests == 0) lengths.clear();
}

int64_t PromptQueue::tokens_up_to(int prompt_tokens) const {
  int64_t n = 0;
  for (const auto& [len, count] : lengths) {
    if (len > prompt_tokens) break;
    n += static_cast<int64_t>(len) * count;
  }
  return n;
}

void ClassQueue::add(std::string_view tenant, int prompt_tokens) {
  PromptQueue::add(prompt_tokens);
  auto it = tenants.find(tenant);
  if (it == tenants.end()) it = tenants.emplace(std::string(tenant), PromptQueue{}).first;
  it->second.add(prompt_tokens);
}

void ClassQueue::remove(std::string_view tenant, int prompt_tokens) {
  PromptQueue::remove(prompt_tokens);
  if (auto t = tenants.find(tenant); t != tenants.end()) {
    t->second.remove(prompt_tokens);
    if (t->second.requests == 0) tenants.erase(t);
  }
  if (requests == 0) tenants.clear();
}

namespace {

class FifoOrder final : public QueueOrder {
 public:
  bool by_class() const override { return false; }
  int64_t tokens_ahead(const ClassQueue& q, int, std::string_view) const override { return q.tokens; }
  bool shares_between_tenants() const override { return false; }
  const char* name() const override { return "fifo"; }
};

class ClassOrder final : public QueueOrder {
 public:
  ClassOrder(bool shortest_first, bool fair_share) : shortest_first_(shortest_first), fair_share_(fair_share) {}

  bool by_class() const override { return true; }

  int64_t tokens_ahead(const ClassQueue& q, int prompt_tokens, std::string_view tenant) const override {
    if (!fair_share_) return ahead_in(q, prompt_tokens);
    int64_t own = 0;
    if (auto it = q.tenants.find(tenant); it != q.tenants.end()) own = ahead_in(it->second, prompt_tokens);
    int64_t n = own;
    for (const auto& [name, tq] : q.tenants) {
      if (name == tenant) continue;
      n += std::min(ahead_in(tq, prompt_tokens), own + std::max(0, prompt_tokens));
    }
    return n;
  }

  bool shares_between_tenants() const override { return fair_share_; }
  const char* name() const override { return "class"; }

 private:
  int64_t ahead_in(const PromptQueue& q, int prompt_tokens) const {
    return shortest_first_ ? q.tokens_up_to(prompt_tokens) : q.tokens;
  }
  bool shortest_first_, fair_share_;
};

}  // namespace

std::shared_ptr<const QueueOrder> fifo_queue_order() {
  static const auto order = std::make_shared<const FifoOrder>();
  return order;
}

std::shared_ptr<const QueueOrder> class_queue_order(bool shortest_first, bool tenant_fair_share) {
  return std::make_shared<const ClassOrder>(shortest_first, tenant_fair_share);
}

}  // namespace metro::sched
