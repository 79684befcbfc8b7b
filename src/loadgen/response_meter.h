// Turns the bytes and times of one HTTP exchange into a RequestRecord: where the first
// token came, the gaps between tokens, how many tokens, and whether it succeeded.
//
// A "token" here is a streamed chunk with non-empty text. Servers that send one token per
// chunk (llama-server, vLLM, metro) make the two the same; the count of output tokens comes
// from the server's usage figures when it sends them (stream_options.include_usage), else
// from the number of such chunks.
#pragma once

#include <string>
#include <string_view>

#include "loadgen/http_client.h"
#include "loadgen/openai_protocol.h"
#include "loadgen/request_record.h"
#include "loadgen/sse_parser.h"

namespace metro::loadgen {

class ResponseMeter {
 public:
  // `record` must outlive the meter; its identity fields and sent_s are the caller's.
  ResponseMeter(RequestRecord& record, bool stream, bool keep_text);

  void on_head(double t_s, int status);
  // Returns false to stop reading: the body cannot be a valid response.
  bool on_body(double t_s, std::string_view bytes);
  // Completes the record.
  void on_done(double t_s, const HttpOutcome& outcome);

 private:
  void on_event(double t_s, const SseEvent& event);
  void set_error(std::string key, std::string detail);

  RequestRecord& r_;
  bool stream_;
  bool keep_text_;
  SseParser sse_;
  std::string body_;  // non-streamed body, or the start of an error body
  double last_token_s_ = -1.0;
  bool saw_done_ = false;  // data: [DONE]
};

}  // namespace metro::loadgen
