// The variant guard's say on the model a request's split picked (gateway/variant_guard.h),
// in the server's terms: the model that serves it, or the error it is answered with.
#pragma once

#include <memory>
#include <optional>

#include "gateway/front_door.h"
#include "server/api_error.h"

namespace metro::server {

struct GuardedPick {
  std::shared_ptr<const gateway::ServedModel> model;  // null: answered with `error` alone
  std::optional<ApiError> error;  // an open breaker (503 circuit_open) or an injected fault
  bool injected = false;          // `error` is an injected fault: it counts against `model`
  double delay_s = 0.0;           // injected latency
};

GuardedPick guarded_pick(gateway::FrontDoor& door, std::shared_ptr<const gateway::ServedModel> picked);

}  // namespace metro::server
