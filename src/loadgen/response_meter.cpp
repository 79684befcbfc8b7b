#include "loadgen/response_meter.h"

#include <cmath>

namespace metro::loadgen {
namespace {

constexpr size_t kMaxErrorBody = 2048;
constexpr size_t kMaxBody = 64u << 20;

std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 300)) out.push_back(c == '\n' || c == '\r' ? ' ' : c);
  return out;
}

}  // namespace

ResponseMeter::ResponseMeter(RequestRecord& record, bool stream, bool keep_text)
    : r_(record), stream_(stream), keep_text_(keep_text) {}

void ResponseMeter::set_error(std::string key, std::string detail) {
  if (!r_.error.empty()) return;  // the first failure is the cause
  r_.error = std::move(key);
  r_.error_detail = std::move(detail);
}

void ResponseMeter::on_head(double, int status) { r_.http_status = status; }

bool ResponseMeter::on_body(double t_s, std::string_view bytes) {
  if (r_.http_status != 200) {
    if (body_.size() < kMaxErrorBody) body_.append(bytes.substr(0, kMaxErrorBody - body_.size()));
    return true;
  }
  if (!stream_) {
    if (body_.size() + bytes.size() > kMaxBody) {
      set_error("bad_response", "response body above 64 MiB");
      return false;
    }
    body_.append(bytes);
    return true;
  }
  Status st = sse_.feed(bytes, [&](const SseEvent& e) { on_event(t_s, e); });
  if (!st.ok()) {
    set_error("bad_response", st.message());
    return false;
  }
  return r_.error.empty();
}

void ResponseMeter::on_event(double t_s, const SseEvent& e) {
  if (!r_.error.empty() || saw_done_) return;
  if (e.data == "[DONE]") {
    saw_done_ = true;
    return;
  }
  if (e.type == "error") {
    set_error("stream_error", printable(e.data));
    return;
  }
  auto chunk = parse_stream_chunk(e.data);
  if (!chunk.ok()) {
    set_error("bad_response", chunk.status().message());
    return;
  }
  if (!chunk->error.empty()) {
    set_error("stream_error", printable(chunk->error));
    return;
  }
  if (!chunk->text.empty()) {
    const double since_sent = t_s - r_.sent_s;
    if (last_token_s_ < 0.0) {
      r_.ttft_s = since_sent;
    } else {
      r_.itl_s.push_back(t_s - last_token_s_);
    }
    last_token_s_ = t_s;
    ++r_.n_content_chunks;
    if (keep_text_) r_.output_text += chunk->text;
  }
  if (!chunk->finish_reason.empty()) r_.finish_reason = chunk->finish_reason;
  if (chunk->usage) {
    if (chunk->usage->prompt_tokens >= 0) r_.prompt_tokens = chunk->usage->prompt_tokens;
    if (chunk->usage->cached_tokens >= 0) r_.cached_tokens = chunk->usage->cached_tokens;
    if (chunk->usage->completion_tokens >= 0) {
      r_.completion_tokens = chunk->usage->completion_tokens;
      r_.usage_reported = true;
    }
  }
}

void ResponseMeter::on_done(double t_s, const HttpOutcome& outcome) {
  r_.done_s = t_s;
  r_.http_status = outcome.status;
  if (outcome.status != 0 && outcome.status != 200) {
    set_error(std::to_string(outcome.status), printable(body_));
  }
  if (outcome.error != TransportError::kNone) {
    // A stream whose [DONE] arrived is whole even if the connection broke afterwards.
    const bool already_whole = stream_ && saw_done_ && r_.http_status == 200;
    if (!already_whole) set_error(std::string(transport_error_name(outcome.error)), outcome.message);
  }
  if (r_.error.empty() && r_.http_status == 200) {
    if (stream_) {
      if (!saw_done_ && r_.finish_reason.empty()) {
        set_error("disconnected", sse_.has_partial_event()
                                      ? "the stream ended inside an event"
                                      : "the stream ended without a finish_reason or [DONE]");
      }
    } else {
      auto c = parse_completion(body_);
      if (!c.ok()) {
        set_error("bad_response", c.status().message());
      } else {
        r_.finish_reason = c->finish_reason;
        if (keep_text_) r_.output_text = c->text;
        if (c->usage && c->usage->prompt_tokens >= 0) r_.prompt_tokens = c->usage->prompt_tokens;
        if (c->usage && c->usage->cached_tokens >= 0) r_.cached_tokens = c->usage->cached_tokens;
        if (c->usage && c->usage->completion_tokens >= 0) {
          r_.completion_tokens = c->usage->completion_tokens;
          r_.usage_reported = true;
        }
      }
    }
  }
  if (!r_.usage_reported) r_.completion_tokens = r_.n_content_chunks;
  if (!r_.ok()) return;
  r_.e2e_s = t_s - r_.sent_s;
  if (stream_ && r_.completion_tokens >= 2 && !std::isnan(r_.ttft_s)) {
    r_.tpot_s = (r_.e2e_s - r_.ttft_s) / static_cast<double>(r_.completion_tokens - 1);
  }
}

}  // namespace metro::loadgen
