#include "loadgen/sse_parser.h"

namespace metro::loadgen {

bool SseParser::process_line(std::string_view line) {
  if (!bom_checked_) {
    bom_checked_ = true;
    if (line.starts_with("\xEF\xBB\xBF")) line.remove_prefix(3);
  }
  if (line.empty()) {
    const bool dispatch = has_data_;
    if (dispatch) {
      event_.type = type_.empty() ? "message" : type_;
      event_.data = std::move(data_);
      if (!event_.data.empty() && event_.data.back() == '\n') event_.data.pop_back();
      event_.id = id_;
      ++n_events_;
    }
    data_.clear();
    type_.clear();
    has_data_ = false;
    pending_ = false;
    return dispatch;
  }
  if (line.front() == ':') return false;  // comment (servers send these as keep-alives)
  pending_ = true;
  std::string_view field = line, value;
  if (auto colon = line.find(':'); colon != std::string_view::npos) {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    data_.append(value);
    data_.push_back('\n');
    has_data_ = true;
  } else if (field == "event") {
    type_.assign(value);
  } else if (field == "id") {
    if (value.find('\0') == std::string_view::npos) id_.assign(value);
  }
  // `retry:` and unknown fields do not matter to a load generator.
  return false;
}

Status SseParser::line_too_long() const {
  return data_loss("event stream line longer than " + std::to_string(max_line_) +
                   " bytes: the server is not sending server-sent events");
}

}  // namespace metro::loadgen
