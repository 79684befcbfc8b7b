// OpenAI request bodies -> engine requests (the request items of docs/reliability.md).
//
// prepare_request() parses and validates a body for one endpoint, renders the chat template,
// tokenizes, and checks every bound before anything reaches the engine. Any byte string is
// safe to pass (fuzz/http_request_fuzz.cpp): the worst outcome is an ApiError.
//
// Unknown fields are ignored, as OpenAI's own API does. Known fields that metro cannot honour
// (suffix, a non-text response_format, best_of above n, echo with logprobs, content parts
// other than text) are refused with 400 rather than silently ignored.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/request.h"
#include "gateway/model_registry.h"
#include "server/api_error.h"
#include "server/server_config.h"
#include "server/tool_calls.h"
#include "tokenizer/tokenizer.h"

namespace metro::tokenizer {
class ChatTemplate;
}

namespace metro::server {

class ResponseStore;
struct ResponsesCall;

// The model endpoints: those that run the engine, and the tokenizer's (answered on the
// prep thread, no engine step).
enum class Endpoint : uint8_t {
  kCompletions,
  kChatCompletions,
  kEmbeddings,
  kTokenize,
  kDetokenize,
  kResponses,
  kFeedback
};
const char* endpoint_path(Endpoint e);

// What preparing a request needs of the loaded model.
struct PromptContext {
  const tokenizer::Tokenizer* tokenizer = nullptr;
  const tokenizer::ChatTemplate* chat_template = nullptr;  // null: chat answers 400
  std::string model_name;
  std::vector<std::string> model_aliases;  // other names the request's `model` may give
  std::string variant;                     // of the served model ("" for the primary)
  int n_ctx = 0;   // context window per sequence
  int n_embd = 0;  // embedding width (the `dimensions` an embeddings request may name)
  // Text longer than this cannot fit the context whatever it tokenizes to (twice the
  // context times the most bytes a token stands for): refused before tokenizing. 0: no bound.
  size_t max_prompt_bytes = 0;
  RequestLimits limits;
  // Where structured-output grammars are compiled and kept (null: response_format other
  // than text is refused).
  grammar::GrammarCache* grammars = nullptr;
  // The body parsed again keeping key order, when it has a JSON schema (its properties
  // are generated in the order given); null otherwise.
  const nlohmann::ordered_json* ordered_body = nullptr;
  // Stored responses (/v1/responses `previous_response_id`, `store`); null: none kept.
  ResponseStore* responses = nullptr;
};

// What the HTTP layer knows of a request besides its body.
struct CallContext {
  std::string tenant;                       // from the API key
  std::optional<std::string> class_header;  // X-Metro-Class
  std::optional<std::string> deadline_header;  // X-Metro-Deadline-Ms
  // The API key's `class=`: the class of requests that name none (standard without one),
  // and the highest class its requests may ask for (a lower one is always allowed).
  std::optional<SlaClass> default_class;
};

// How to shape the answer.
struct ResponseSpec {
  Endpoint endpoint = Endpoint::kCompletions;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int n = 1;                   // choices per engine request
  std::string model;           // echoed in responses
  std::string variant;         // the served variant ("" for a name's primary)
  // /v1/completions
  bool echo = false;
  std::vector<std::string> echo_text;  // per prompt, when echo
  int logprobs = -1;                   // -1: none; else top alternatives per token
  // /v1/chat/completions
  bool chat_logprobs = false;
  int top_logprobs = 0;
  // /v1/embeddings
  bool base64 = false;
  // Chat with tools (tool_choice other than none): the output is read as tool calls.
  std::shared_ptr<const ToolRequest> tools;
  // /v1/responses: what the response object repeats and where it is stored.
  std::shared_ptr<const ResponsesCall> responses;
  // Answered from the semantic cache at this similarity (-1: computed): the response says
  // so in `"metro": {"cache": "semantic", "similarity": s}`.
  double cache_similarity = -1.0;
};

struct PreparedCall {
  std::vector<engine::Request> requests;  // one per prompt, in choice order
  ResponseSpec spec;
  int prompt_tokens = 0;  // over every prompt
};

ApiResult<PreparedCall> prepare_request(Endpoint endpoint, std::string_view body, const PromptContext& ctx,
                                        const CallContext& call);
// The same over a body already parsed with parse_body().
ApiResult<PreparedCall> prepare_parsed_request(Endpoint endpoint, const nlohmann::json& body, const PromptContext& ctx,
                                        const CallContext& call);

// Whether the body must also be read in key order (PromptContext::ordered_body): it may hold
// a JSON schema or tools, or it is a /v1/responses request.
bool needs_key_order(Endpoint endpoint, std::string_view body);
// A request body as JSON: 400 for an empty body, invalid JSON, deep nesting, not an object.
ApiResult<nlohmann::json> parse_body(std::string_view body);
// The body's `model`: "" when absent; 400 when it is not a string.
ApiResult<std::string> requested_model(const nlohmann::json& body);
// POST /tokenize and /detokenize (vLLM's shapes, llama-server's names accepted too): the
// response body. Tokenize takes `prompt` (or `content`) with `add_special_tokens` (or
// `add_special`, default true), or chat `messages` rendered by the model's template;
// answers {"tokens", "count", "max_model_len"}. Detokenize takes `tokens`; answers
// {"prompt"} (and the same text as "content").
ApiResult<std::string> tokenize_response(const nlohmann::json& body, const PromptContext& ctx);
ApiResult<std::string> detokenize_response(const nlohmann::json& body, const PromptContext& ctx);

// What preparing a request for a served model needs of it.
PromptContext prompt_context(const gateway::ServedModel& m, const RequestLimits& limits);

// Pieces of prepare_request, exposed for tests.
namespace detail {

// The sampling and stop fields shared by chat and completions. `default_max_tokens` < 0
// means "the rest of the context" (chat); the caller clamps and checks against the prompt.
struct GenerationFields {
  engine::SamplingParams sampling;
  engine::StopConditions stop;
  std::optional<int> max_tokens;  // as given
  int n = 1;
  bool stream = false;
  bool include_usage = false;
  SlaClass sla_class = SlaClass::kStandard;
  int64_t deadline_ns = 0;  // 0: none
  // Speculative decoding: OpenAI's `prediction` ({"type": "content", "content": text or
  // text parts}) tokenized, at most the context long; `metro.speculative` (default true).
  std::vector<int32_t> prediction;
  bool speculative = true;
  // Precision tiers: `metro.tier` ("high" | "low") pins the request to a tier; unset: the
  // server's pins by class, else the load decides. Ignored by a server with one tier.
  std::optional<engine::adaptive::Tier> tier;
  // Structured output: `response_format` json_object / json_schema, or `metro.choice`.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  std::string grammar_trigger;  // tool calls under auto: the grammar holds from this text on
};
std::optional<ApiError> parse_generation_fields(const nlohmann::json& body, Endpoint endpoint, const PromptContext& ctx,
                                                const CallContext& call, GenerationFields* out);

// The traffic fields every model endpoint takes: the SLA class (X-Metro-Class header, else
// the body's `metro_class`, else the key's default class, else standard) and an optional
// deadline (X-Metro-Deadline-Ms header, else `metro_deadline_ms`: milliseconds from now by
// which the first token must be out; admission refuses what cannot make it).
std::optional<ApiError> parse_traffic_fields(const nlohmann::json& body, const CallContext& call,
                                             SlaClass* cls, int64_t* deadline_ns);

// `model` must be absent or name the served model (404 model_not_found otherwise).
std::optional<ApiError> check_model(const nlohmann::json& body, const PromptContext& ctx);
// 404 model_not_found for a name no served model has.
ApiError unknown_model_error(const std::string& name, const std::vector<std::string>& served);

// Prompts of /v1/completions and inputs of /v1/embeddings: a string, an array of strings,
// an array of token ids, or an array of arrays of token ids.
struct Prompt {
  std::vector<int32_t> tokens;
  std::string text;  // the text (decoded for token-id prompts), for echo
};
ApiResult<std::vector<Prompt>> parse_prompts(const nlohmann::json& value, const char* param, const PromptContext& ctx,
                                             bool parse_special);

// Chat messages -> prompt token ids (template rendered, special-token text in message
// content kept as text). `tools`: the request's tools (null: none), shown to the template
// (the generic format: described in a system message).
ApiResult<std::vector<int32_t>> chat_prompt(const nlohmann::json& body, const PromptContext& ctx,
                                            const ToolRequest* tools = nullptr);

// Message content that spells a control token (`<|im_end|>`) must stay text. Such content is rendered as a random placeholder; the rendered prompt is then
// tokenized with special tokens parsed in the template's own text and the content spliced
// back in as plain text. Each placeholder must appear exactly once in `rendered`.
struct ProtectedContent {
  std::string placeholder;
  std::string text;
};
ApiResult<std::vector<int32_t>> tokenize_rendered(const tokenizer::Tokenizer& tok, const std::string& rendered,
                                                  const std::vector<ProtectedContent>& protected_contents);
// True when `text` holds the text of a control token.
bool has_control_text(const tokenizer::Tokenizer& tok, std::string_view text);
// 400 context_length_exceeded when `bytes` of text are over ctx.max_prompt_bytes.
std::optional<ApiError> check_prompt_bytes(size_t bytes, const PromptContext& ctx, const std::string& param);

}  // namespace detail

}  // namespace metro::server
