// How a scheduling policy orders waiting prompts, in the terms admission control can see:
// which of the prompts queued before a new request will be served before it. Admission
// (gateway/admission.h) keeps the queue and predicts a request's time to first token from
// the work ahead of it; the policy that will serve the queue says what "ahead" means, so the
// gateway never models a policy of its own.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace metro::sched {

// Admitted prompts that have not started yet: how many, how many tokens, their lengths.
struct PromptQueue {
  int requests = 0;
  int64_t tokens = 0;
  std::map<int, int> lengths;  // prompt length -> count

  void add(int prompt_tokens);
  // Clamped at zero: a caller's miscount must not drive the queue negative.
  void remove(int prompt_tokens);
  // Tokens of the prompts no longer than `prompt_tokens`.
  int64_t tokens_up_to(int prompt_tokens) const;
};

// One SLA class's queue, and the same per tenant (a tenant leaves when it has none queued).
struct ClassQueue : PromptQueue {
  std::map<std::string, PromptQueue, std::less<>> tenants;

  void add(std::string_view tenant, int prompt_tokens);
  void remove(std::string_view tenant, int prompt_tokens);
};

class QueueOrder {
 public:
  virtual ~QueueOrder() = default;
  // True when classes are served best first (a request waits behind the queues of its own
  // class and the classes above it only); false when every class shares one order (then
  // every queued prompt of every class counts as the request's own queue).
  virtual bool by_class() const = 0;
  // Tokens of queue `q` served before a new prompt of `prompt_tokens` from `tenant`.
  virtual int64_t tokens_ahead(const ClassQueue& q, int prompt_tokens, std::string_view tenant) const = 0;
  // Whether the policy shares a class between tenants, so that a class whose queue is full
  // still takes a tenant holding less than its share of the bound.
  virtual bool shares_between_tenants() const = 0;
  virtual const char* name() const = 0;
};

// Arrival order over all classes (FCFS): everything queued is ahead.
std::shared_ptr<const QueueOrder> fifo_queue_order();

// The SLA policy's order: classes best first; inside a class the shortest prompt first
// (remaining-output predictions also enter the policy's order; prompt length is what
// admission knows) and, with tenant fair share, tenants interleaved: another tenant's queue
// is ahead only up to as much as the request's own tenant has ahead of it plus itself.
std::shared_ptr<const QueueOrder> class_queue_order(bool shortest_first = true, bool tenant_fair_share = true);

}  // namespace metro::sched
