// An incremental parser for text/event-stream (the WHATWG "server-sent events" format).
//
// Bytes arrive in whatever pieces the network delivers: an event, a line, a CRLF pair or a
// UTF-8 sequence may be cut anywhere. feed() keeps the unfinished tail and emits each event
// once its terminating blank line has arrived. Lines end in LF, CRLF or CR; lines starting
// with ':' are comments; a field's value loses one leading space; several data lines are
// joined with LF. Unknown fields are ignored. An unterminated event at end of stream is
// dropped, as the format says (finish() tells whether there was one).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "base/status.h"

namespace metro::loadgen {

struct SseEvent {
  std::string type = "message";  // the `event:` field
  std::string data;              // the `data:` lines joined with '\n'
  std::string id;                // the last `id:` field seen on this event
};

class SseParser {
 public:
  // Lines longer than this are an error: a server sending megabytes without a newline is
  // broken, and the parser must not buffer without bound.
  static constexpr size_t kDefaultMaxLineBytes = 8u << 20;

  explicit SseParser(size_t max_line_bytes = kDefaultMaxLineBytes) : max_line_(max_line_bytes) {}

  // Parses bytes, calling on_event(const SseEvent&) for each completed event. Returns an
  // error (and stops) when a line exceeds the limit; the parser is then unusable.
  template <class OnEvent>
  Status feed(std::string_view bytes, OnEvent&& on_event) {
    size_t pos = 0;
    while (pos < bytes.size()) {
      if (skip_lf_) {
        skip_lf_ = false;
        if (bytes[pos] == '\n') {
          ++pos;
          continue;
        }
      }
      size_t end = bytes.find_first_of("\r\n", pos);
      if (end == std::string_view::npos) {
        if (line_.size() + (bytes.size() - pos) > max_line_) return line_too_long();
        line_.append(bytes.substr(pos));
        break;
      }
      if (line_.size() + (end - pos) > max_line_) return line_too_long();
      std::string_view line;
      if (line_.empty()) {
        line = bytes.substr(pos, end - pos);
      } else {
        line_.append(bytes.substr(pos, end - pos));
        line = line_;
      }
      if (bytes[end] == '\r') skip_lf_ = true;
      pos = end + 1;
      if (process_line(line)) on_event(static_cast<const SseEvent&>(event_));
      line_.clear();
    }
    return Status::ok_status();
  }

  // True when bytes of an event (or a line) arrived after the last complete event.
  bool has_partial_event() const { return !line_.empty() || pending_; }
  // Events completed so far.
  size_t n_events() const { return n_events_; }

 private:
  // Returns true when `line` completes an event, which is then in event_.
  bool process_line(std::string_view line);
  Status line_too_long() const;

  size_t max_line_;
  std::string line_;        // an unterminated line carried between feeds
  bool skip_lf_ = false;    // the last byte was CR: a following LF belongs to it
  bool bom_checked_ = false;
  bool pending_ = false;    // fields of an event seen since the last dispatch
  bool has_data_ = false;
  SseEvent event_;
  std::string type_, data_, id_;
  size_t n_events_ = 0;
};

}  // namespace metro::loadgen
