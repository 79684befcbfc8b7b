// What the load generator measured for one request.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace metro::loadgen {

inline constexpr double kNotMeasured = std::numeric_limits<double>::quiet_NaN();

struct RequestRecord {
  // Identity.
  size_t session = 0;  // index into Workload::sessions
  size_t turn = 0;     // index into that session's turns
  std::string class_name;
  int64_t input_words = 0;  // prompt length the dataset aimed for (0: unknown, a file's prompt)
  int64_t max_tokens = 0;

  // Times in seconds from the start of the run. Latencies count from sent_s: time spent
  // waiting for a free slot under --max-concurrency is queue time, reported on its own.
  double scheduled_s = 0.0;  // when the arrival process (or the previous turn) released it
  double sent_s = 0.0;       // when its connection was asked for
  double done_s = 0.0;       // when the response ended (or failed)

  // Outcome. error is empty for a success, otherwise the key under which the report counts
  // it: an HTTP status ("429", "503") or a transport failure ("timeout", "disconnected",
  // "connect_error", "bad_response", "stream_error").
  int http_status = 0;  // 0: no response head arrived
  std::string error;
  std::string error_detail;  // first bytes of an error body, or the transport's message
  bool ok() const { return error.empty(); }

  // Latencies in seconds; kNotMeasured where the request did not produce them.
  double ttft_s = kNotMeasured;  // first content token (streaming only)
  double tpot_s = kNotMeasured;  // (e2e - ttft) / (output tokens - 1), 2+ tokens, streaming
  double e2e_s = kNotMeasured;   // whole response, successful requests
  std::vector<double> itl_s;     // gaps between successive content chunks (streaming)

  // Tokens: the server's usage figures when it sent them, else the count of content chunks.
  int64_t prompt_tokens = -1;  // -1: the server did not say
  int64_t cached_tokens = -1;  // of those, served from the server's prefix cache (-1: not said)
  int64_t completion_tokens = 0;
  bool usage_reported = false;
  int64_t n_content_chunks = 0;
  std::string finish_reason;

  std::string output_text;  // kept only when a later turn of the session resends it

  double queue_s() const { return sent_s - scheduled_s; }
  double max_itl_s() const {
    double m = kNotMeasured;
    for (double v : itl_s) m = std::isnan(m) || v > m ? v : m;
    return m;
  }
};

}  // namespace metro::loadgen
