// What the semantic cache keys a request by: the text whose meaning is compared (the
// conversation without its system prompt, or the completion prompt) and the namespace that
// must match exactly (tenant, model variant, and every other field of the body: sampling
// parameters, stops, response format, tools, the system prompt).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "server/api_error.h"
#include "server/openai_request.h"

namespace metro::server {

// `"metro": {"semantic_cache": true}`: the request opts in. 400 when the field is not a
// boolean.
ApiResult<bool> asks_semantic_cache(const nlohmann::json& body);

struct SemanticKey {
  std::string text;
  uint64_t ns = 0;
};

// The key of a prepared chat or completions call; nullopt (with the reason in `why`) when the
// call cannot be answered from the cache: several prompts or choices, log-probabilities, or
// sampling that is not deterministic (a temperature above 0 without a seed).
std::optional<SemanticKey> semantic_key(Endpoint endpoint, const nlohmann::json& body, const PreparedCall& pc,
                                        const std::string& tenant, const std::string& model_id, std::string* why);

}  // namespace metro::server
