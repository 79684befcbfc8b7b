// Engine events -> OpenAI response bodies and SSE chunks.
//
// One ResponseFormatter per HTTP request. The engine requests of a call (one per prompt)
// feed it their events in order; it builds either streamed chunks (`data: {...}\n\n`, then
// `data: [DONE]\n\n`; for /v1/responses the Responses API's typed events) or, after every
// request is done, one JSON body. Output is always
// valid UTF-8: text from the model has ill-formed bytes replaced with U+FFFD.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/api_error.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace metro::server {

// "chatcmpl-...", "cmpl-...", "resp_..." or "embd-..." with 24 random alphanumerics.
std::string make_response_id(Endpoint endpoint);

// One SSE event carrying `json_text`.
std::string sse_event(const std::string& json_text);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// RFC 4648 base64 of raw bytes.
std::string base64_encode(const void* data, size_t n);

class ResponseFormatter {
 public:
  ResponseFormatter(ResponseSpec spec, tokenizer::Tokenizer tokenizer, size_t n_requests, std::string id,
                    int64_t created_unix_s);

  // An event of engine request `request_index`. Streaming calls get SSE bytes to send
  // appended to *out (possibly none).
  void on_event(size_t request_index, const engine::Event& e, std::string* out);
  bool all_done() const { return n_done_ == n_requests_; }
  // After all_done(): the JSON body (non-streaming) or the closing SSE events ([DONE]).
  std::string finish();

  // Set when a choice ended by abort or error; a non-streaming call answers with it.
  const std::optional<ApiError>& failure() const { return failure_; }
  const ResponseSpec& spec() const { return spec_; }
  const engine::Usage& usage() const { return usage_; }
  // Each choice's finish reason ("stop", "length", "tool_calls", "abort"; "" if unfinished).
  std::vector<std::string> finish_reasons() const;
  // For metrics: steady-clock times of the first and last generated token, token count.
  int64_t first_token_ns() const { return first_token_ns_; }
  int64_t last_token_ns() const { return last_token_ns_; }
  int generated_tokens() const { return generated_tokens_; }
  const std::string& id() const { return id_; }

 private:
  struct ChoiceState {
    std::string text;
    bool started = false;
    std::string finish_reason;
    size_t text_bytes = 0;            // for completions text_offset
    nlohmann::ordered_json logprobs;  // accumulated for non-streaming responses
    // Chat with tools, streaming: the calls read from the text so far, and how many started.
    std::unique_ptr<ToolCallStream> tool_stream;
    int n_calls = 0;
  };

  nlohmann::ordered_json chunk_base() const;
  // `{"cache": "semantic", "similarity": s}` of an answer from the semantic cache.
  nlohmann::ordered_json cache_mark() const;
  nlohmann::ordered_json usage_json() const;
  nlohmann::ordered_json chat_logprobs(const std::vector<engine::TokenInfo>& tokens) const;
  nlohmann::ordered_json completion_logprobs(const std::vector<engine::TokenInfo>& tokens, size_t* offset) const;
  void on_delta(size_t choice, const engine::Event& e, std::string* out);
  void on_finish(size_t choice, const engine::Event& e, std::string* out);
  std::string finish_body();
  void append_logprobs(ChoiceState& c, const nlohmann::ordered_json& lp);
  // Streamed output of choice ci under tools, in order: content chunks (the first carries
  // `lp` when given), a chunk naming each call as it starts, chunks of its arguments as they
  // are written.
  void send_tool_pieces(size_t ci, const ToolStreamPieces& pieces, nlohmann::ordered_json lp, std::string* out);
  bool parses_tools() const { return spec_.tools != nullptr && spec_.endpoint == Endpoint::kChatCompletions; }
  // /v1/responses (openai_responses.cpp): one SSE event of the Responses API stream, with
  // its sequence number; the output message and the response object in a given status;
  // the events that open a streamed response; a piece of text; the body or closing events.
  // With tools, the output is a message (the text outside calls) and a function_call item
  // per call, each opened in the stream as it starts.
  struct ResponsesItem {
    bool call = false;
    std::string id, call_id, name;
    std::string text;  // the message's text, or the call's arguments
    std::string status = "in_progress";
  };
  std::string responses_event(nlohmann::ordered_json ev);
  nlohmann::ordered_json responses_item(const ResponsesItem& item) const;
  nlohmann::ordered_json responses_object(const char* status) const;
  std::string responses_open();
  // Opens the message item (once) and returns its output index.
  size_t responses_open_message(std::string* out);
  void responses_delta(const std::string& text, std::string* out);
  void responses_tool_pieces(const ToolStreamPieces& pieces, std::string* out);
  // The output items of a whole (not streamed) response from its text.
  void responses_items_from_text(const std::string& text);
  std::string responses_finish();

  ResponseSpec spec_;
  tokenizer::Tokenizer tok_;
  size_t n_requests_;
  size_t n_done_ = 0;
  std::string id_;
  int64_t created_;
  std::vector<ChoiceState> choices_;
  std::vector<std::vector<float>> embeddings_;
  engine::Usage usage_;
  std::optional<ApiError> failure_;
  bool failure_sent_ = false;
  int64_t first_token_ns_ = 0;
  int64_t last_token_ns_ = 0;
  int generated_tokens_ = 0;
  // Precision tiers: the tier of the latest token (a streamed chunk names it) and of every
  // token so far (a whole body names them all); -1 / 0 on a server with one tier.
  int8_t last_tier_ = -1;
  uint8_t tiers_seen_ = 0;
  // /v1/responses: the output items, which of them is the message (-1: none yet), the
  // stream's next sequence number, and whether the opening events went out.
  std::vector<ResponsesItem> resp_items_;
  int resp_message_ = -1;
  int64_t responses_seq_ = 0;
  bool responses_open_ = false;
};

// `system_fingerprint`: "metro" ("metro@canary" from a variant), or on a server with precision tiers "metro-" and the tiers
// that produced the output ("metro-high", "metro-low", "metro-high+low"); `tiers` holds bit
// (1 << tier) for each.
// A served variant (`name@variant`) adds "@variant" after "metro".
std::string system_fingerprint(uint8_t tiers, const std::string& variant = {});

}  // namespace metro::server
