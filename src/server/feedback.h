// POST /v1/feedback: a user's rating of an answer it received, by the answer's id (the
// response body's `id`, or its x-request-id):
//
//   {"id": "chatcmpl-...", "rating": 1 | -1 | "good" | "bad"}
//   -> {"object": "feedback", "id": "...", "rating": "good" | "bad"}
//
// The rating counts for the variant that answered (metro_variant_feedback_total) and, for a
// variant under rollout, in its feedback test (gateway/variant_guard.h). 404 for an id that
// is unknown, forgotten (answers are remembered until 65536 newer ones) or another tenant's.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "gateway/variant_guard.h"
#include "server/api_error.h"

namespace metro::server {

ApiResult<std::string> feedback_response(const nlohmann::json& body, const std::string& tenant,
                                         gateway::VariantGuard& guard);

}  // namespace metro::server
