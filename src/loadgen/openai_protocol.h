// The parts of the OpenAI HTTP API a load generator speaks: request bodies for
// /v1/completions and /v1/chat/completions, and the fields it reads back from streamed
// chunks and whole responses. Servers differ in extras (llama-server adds "timings", vLLM
// "prompt_logprobs"); only the common fields are read, and missing optional ones are fine.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "base/status.h"
#include "loadgen/dataset.h"

namespace metro::loadgen {

enum class Endpoint { kCompletions, kChat };

std::string_view endpoint_name(Endpoint e);  // "completions" or "chat"
// "/v1/completions" or "/v1/chat/completions" under base_path ("" or "/v1" or "/x/v1").
std::string endpoint_path(std::string_view base_path, Endpoint e);
std::string models_path(std::string_view base_path);

struct BodyOptions {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;           // omitted when empty
  bool stream = true;
  bool include_usage = true;   // stream_options.include_usage, when streaming
  bool ignore_eos = true;      // llama-server and vLLM extension: generate max_tokens tokens
  std::optional<double> temperature;
};

std::string request_body(const BodyOptions& options, std::span<const ChatMessage> messages,
                         int64_t max_tokens);

struct Usage {
  int64_t prompt_tokens = -1;
  int64_t completion_tokens = -1;
  int64_t cached_tokens = -1;  // usage.prompt_tokens_details.cached_tokens: prefix-cache hits
};

// One `data:` payload of a streamed response (not "[DONE]").
struct StreamChunk {
  std::string text;             // the new text of choice 0 (content or reasoning), may be empty
  std::string finish_reason;    // empty until the last chunk of the choice
  std::optional<Usage> usage;   // with include_usage: the last chunk
  std::string error;            // a server's in-stream {"error": ...}
};

Expected<StreamChunk> parse_stream_chunk(std::string_view data);

// A whole non-streamed response body.
struct Completion {
  std::string text;
  std::string finish_reason;
  std::optional<Usage> usage;
};

Expected<Completion> parse_completion(std::string_view body);

// The id of the first model a GET /v1/models lists.
Expected<std::string> parse_first_model_id(std::string_view body);

}  // namespace metro::loadgen
