#include "server/guarded_pick.h"

#include <string>
#include <utility>

namespace metro::server {

GuardedPick guarded_pick(gateway::FrontDoor& door, std::shared_ptr<const gateway::ServedModel> picked) {
  GuardedPick out;
  const std::string id = picked->id();
  gateway::GuardRoute g = door.guard().route(std::move(picked));
  if (!g.model) {
    // Refused before any variant served it: nothing to count against one.
    out.error = unavailable_error("the model '" + id + "' is failing and its circuit breaker is open; retry later",
                                  "circuit_open", static_cast<int>(g.retry_after_s));
    return out;
  }
  out.model = std::move(g.model);
  out.delay_s = g.delay_s;
  if (g.inject_status != 0) {
    ApiError e;
    e.status = g.inject_status;
    e.type = g.inject_status >= 500 ? "server_error" : "invalid_request_error";
    e.message = "a fault injected into '" + out.model->id() + "' (--fault)";
    e.code = "fault_injected";
    out.error = std::move(e);
    out.injected = true;
  }
  return out;
}

}  // namespace metro::server
