// The admin API: the served models' variants, splits, rollouts and breakers, behind an
// admin key of its own (`--admin-key-file`; without one every /admin path answers 404).
//
//   GET  /admin/models                              every model, its share, breaker, rollout
//   POST /admin/models/{name}/split?variant=V&share=PCT      set a variant's share
//   POST /admin/models/{name}/promote?variant=V[&share=PCT]  end its rollout at PCT (100)
//   POST /admin/models/{name}/rollback?variant=V             share 0, counted as "manual"
//   POST /admin/models/{name}/rollout?variant=V&steps=5,25,100&step=10m   start a rollout
//   POST /admin/models/{name}/load?path=FILE[&variant=V]   load a file while serving (202;
//                                                  GET /admin/models shows when it is done)
//   POST /admin/models/{name}/unload[?variant=V]   stop serving it; requests in flight finish
//
// Parameters travel in the query string (no body). Answers are JSON; a change answers the
// state after it.
#pragma once

#include <string>

#include "server/routes.h"
#include "server/server_core.h"

namespace metro::server {

// Whether `path` belongs to the admin API.
bool is_admin_path(const std::string& path);
// Answers an admin request (auth included); `target` is the path with its query.
HttpResponse admin_response(const RequestHead& head, ServerCore& core);

}  // namespace metro::server
