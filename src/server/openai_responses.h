// POST /v1/responses, OpenAI's Responses API for text: a request read as the chat request
// it amounts to, and what the response object and its stream repeat of it.
//
// Taken: `input` (a string, or message items with a role (user, assistant, system,
// developer) and text content: a string or input_text / output_text parts),
// `instructions` (a system message, not carried over to continuations, as OpenAI does),
// `previous_response_id` (continues a stored conversation of the same tenant; 404
// previous_response_not_found otherwise), `store` (default true), `max_output_tokens`,
// `temperature`, `top_p`, `text.format` (text, json_object, json_schema: structured outputs
// as on chat), `metadata`, `user`, `stream`, and the chat fields metro adds (`seed`, `stop`,
// `top_k`, `min_p`, penalties, `logit_bias`, `metro`, `metro_class`,
// `metro_deadline_ms`). Function tools: `tools` ({"type": "function", "name",
// "description", "parameters", "strict"}), `tool_choice`, `parallel_tool_calls`, and as
// input `function_call` and `function_call_output` items (the calls made and their
// results); the output then holds a function_call item per call, streamed as it is
// written. Refused with 400 naming the field: other tool types, `background`, other input
// items and content parts other than text.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "server/openai_request.h"

namespace metro::server {

class ResponseStore;

struct ResponsesCall {
  // The request fields the response object repeats (instructions, max_output_tokens,
  // previous_response_id, temperature, top_p, store, metadata, text, user), with defaults.
  nlohmann::ordered_json echo;
  // The messages of this turn and those before it, without the instructions: what a stored
  // response is continued from (the answer is added when it is stored).
  nlohmann::json conversation;
  ResponseStore* store = nullptr;  // null: not stored (`store: false`, or no store)
  std::string tenant;
};

// `body` in key order (a JSON schema's properties are generated in the order given).
ApiResult<PreparedCall> prepare_responses(const nlohmann::ordered_json& body, const PromptContext& ctx,
                                          const CallContext& call);

}  // namespace metro::server
