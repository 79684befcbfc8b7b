// ToolCallStream: the whole-output reading of tool_calls.cpp, fed as the text streams.
#include <algorithm>
#include <string>

#include "server/tool_call_text.h"
#include "server/tool_calls.h"

namespace metro::server {

using namespace detail;

ToolCallStream::ToolCallStream(ToolFormat f) : format_(f) {
  switch (f) {
    case ToolFormat::kGeneric:
      phase_ = Phase::kGenericStart;
      break;
    case ToolFormat::kLlama3:
      phase_ = Phase::kLlamaStart;
      break;
    case ToolFormat::kHermes:
    case ToolFormat::kMistral:
      phase_ = Phase::kText;
      break;
  }
}

namespace {

void push_piece(ToolStreamPieces* out, ToolStreamPiece::Kind kind, std::string_view text) {
  if (text.empty() && kind != ToolStreamPiece::Kind::kCall) return;
  if (kind != ToolStreamPiece::Kind::kCall && !out->empty() && out->back().kind == kind) {
    out->back().text += text;
    return;
  }
  out->push_back(ToolStreamPiece{kind, std::string(text)});
}

void push_whole(ToolStreamPieces* out, ParsedToolOutput po, std::string* pending_ws) {
  // The whitespace before the trigger belongs to the text unless a call follows.
  if (po.calls.empty()) push_piece(out, ToolStreamPiece::Kind::kContent, *pending_ws);
  pending_ws->clear();
  push_piece(out, ToolStreamPiece::Kind::kContent, po.content);
  for (ToolCall& c : po.calls) {
    push_piece(out, ToolStreamPiece::Kind::kCall, c.name);
    push_piece(out, ToolStreamPiece::Kind::kArguments, c.arguments);
  }
}

// A call object's head longer than this (whitespace) is not streamed: it is read whole.
constexpr size_t kMaxCallHead = 4096;

}  // namespace

void ToolCallStream::emit_content(ToolStreamPieces* out, std::string_view s) {
  push_piece(out, ToolStreamPiece::Kind::kContent, s);
}

void ToolCallStream::start_call(size_t at) {
  call_ = CallReader{};
  call_.start = at;
  call_.scan = at;
}

ToolCallStream::ReadResult ToolCallStream::read_call(ToolStreamPieces* out) {
  CallReader& r = call_;
  const std::string_view s = held_;
  if (r.phase == CallReader::Phase::kHead) {
    std::string name;
    size_t value_at = 0;
    // Only the first kMaxCallHead bytes are looked at, so that the outcome does not depend
    // on how the text was cut.
    const std::string_view window = s.substr(0, std::min(s.size(), r.start + kMaxCallHead));
    Match m = match_call_head(window, r.start, format_ == ToolFormat::kLlama3 ? "parameters" : "arguments", &name,
                              &value_at);
    if (m == Match::kMore && s.size() > r.start + kMaxCallHead) m = Match::kNo;
    if (m == Match::kMore) return ReadResult::kMore;
    if (m == Match::kNo) {
      r.phase = CallReader::Phase::kWhole;
    } else {
      push_piece(out, ToolStreamPiece::Kind::kCall, name);
      pending_ws_.clear();
      r.begun = begun_ = true;
      r.phase = CallReader::Phase::kArguments;
      r.scan = value_at;
    }
  }
  if (r.phase == CallReader::Phase::kArguments) {
    const size_t from = r.scan;
    size_t i = r.scan;
    bool closed = false;
    for (; i < s.size() && !closed; ++i) {
      const char c = s[i];
      if (r.escape) {
        r.escape = false;
      } else if (r.in_string) {
        if (c == '\\') {
          r.escape = true;
        } else if (c == '"') {
          r.in_string = false;
        }
      } else if (c == '"') {
        r.in_string = true;
      } else if (c == '{' || c == '[') {
        ++r.depth;
      } else if (c == '}' || c == ']') {
        closed = --r.depth == 0;
      }
    }
    push_piece(out, ToolStreamPiece::Kind::kArguments, s.substr(from, i - from));
    r.scan = i;
    if (!closed) return ReadResult::kMore;
    r.phase = CallReader::Phase::kTail;
  }
  if (r.phase == CallReader::Phase::kTail) {
    size_t i = r.scan;
    while (i < s.size() && is_ws(s[i])) ++i;
    if (i >= s.size()) return ReadResult::kMore;
    if (s[i] == '}') {
      r.scan = i + 1;
      return ReadResult::kCall;
    }
    r.phase = CallReader::Phase::kWhole;  // more members after the arguments
  }
  const size_t end = json_end(s, r.start);
  if (end == std::string_view::npos) return ReadResult::kMore;
  r.scan = end;
  if (r.begun) return ReadResult::kCall;
  const std::string_view obj = s.substr(r.start, end - r.start);
  auto j = parse_json(obj);
  auto c = j ? call_from(*j, obj) : std::nullopt;
  if (!c) return ReadResult::kNotACall;
  push_piece(out, ToolStreamPiece::Kind::kCall, c->name);
  push_piece(out, ToolStreamPiece::Kind::kArguments, c->arguments);
  pending_ws_.clear();
  r.begun = begun_ = true;
  return ReadResult::kCall;
}

// Free text of the hermes and mistral formats, up to the trigger.
void ToolCallStream::text(ToolStreamPieces* out) {
  const std::string_view trigger = tool_call_trigger(format_);
  const size_t at = held_.find(trigger);
  if (at == std::string::npos) {
    // Held back: what may yet become the trigger, and the whitespace before it (dropped if a
    // call follows).
    size_t keep = partial_suffix(held_, trigger);
    while (keep < held_.size() && is_ws(held_[held_.size() - keep - 1])) ++keep;
    std::string_view give = std::string_view(held_).substr(0, held_.size() - keep);
    if (after_call_) {
      give = ltrim(give);
      if (!give.empty()) after_call_ = false;
    }
    emit_content(out, give);
    held_.erase(0, held_.size() - keep);
    return;
  }
  std::string before = held_.substr(0, at);
  if (after_call_) before = std::string(ltrim(before));
  const size_t text_end = before.find_last_not_of(" \n\t\r");
  pending_ws_ = before.substr(text_end == std::string::npos ? 0 : text_end + 1);
  before.resize(before.size() - pending_ws_.size());
  emit_content(out, before);
  held_.erase(0, at);
  pos_ = trigger.size();
  begun_ = false;
  phase_ = format_ == ToolFormat::kHermes ? Phase::kHermesOpen : Phase::kMistralOpen;
}

ToolStreamPieces ToolCallStream::feed(std::string_view t) {
  ToolStreamPieces out;
  if (phase_ == Phase::kPass) {
    emit_content(&out, t);
    return out;
  }
  if (phase_ == Phase::kDone) return out;
  held_ += t;
  const auto skip_ws = [&](size_t i) {
    while (i < held_.size() && is_ws(held_[i])) ++i;
    return i;
  };
  while (true) {
    switch (phase_) {
      case Phase::kText:
        text(&out);
        if (phase_ == Phase::kText) return out;
        break;
      case Phase::kHermesOpen: {
        const size_t i = skip_ws(pos_);
        if (i >= held_.size()) return out;
        if (held_[i] == '{') {
          start_call(i);
          phase_ = Phase::kHermesCall;
        } else {
          phase_ = Phase::kHermesRaw;
        }
        break;
      }
      case Phase::kHermesCall:
        switch (read_call(&out)) {
          case ReadResult::kMore:
            return out;
          case ReadResult::kCall:
            pos_ = call_.scan;
            phase_ = Phase::kHermesTail;
            break;
          case ReadResult::kNotACall:
            phase_ = Phase::kHermesRaw;
            break;
        }
        break;
      case Phase::kHermesTail: {
        // The close, after whitespace; anything else before it is dropped with the block.
        const size_t i = skip_ws(pos_);
        if (i >= held_.size()) return out;
        Cursor c{held_, i};
        const Match m = c.lit(kHermesClose);
        if (m == Match::kMore) return out;
        size_t end = c.i;
        if (m == Match::kNo) {
          const size_t close = held_.find(kHermesClose, i);
          if (close == std::string::npos) return out;
          end = close + kHermesClose.size();
        }
        held_.erase(0, end);
        pos_ = 0;
        after_call_ = true;
        phase_ = Phase::kText;
        break;
      }
      case Phase::kHermesRaw: {
        const size_t close = held_.find(kHermesClose, kHermesOpen.size());
        if (close == std::string::npos) return out;
        const size_t end = close + kHermesClose.size();
        ParsedToolOutput block = parse_hermes(std::string_view(held_).substr(0, end));
        after_call_ = !block.calls.empty();
        push_whole(&out, std::move(block), &pending_ws_);
        held_.erase(0, end);
        pos_ = 0;
        phase_ = Phase::kText;
        break;
      }
      case Phase::kMistralOpen: {
        const size_t i = skip_ws(pos_);
        if (i >= held_.size()) return out;
        if (held_[i] == '[') {
          pos_ = i + 1;
          phase_ = Phase::kArray;
        } else if (held_[i] == '{') {
          start_call(i);
          phase_ = Phase::kLone;
        } else {
          phase_ = Phase::kHold;
        }
        break;
      }
      case Phase::kArray: {
        size_t i = pos_;
        while (i < held_.size() && (is_ws(held_[i]) || held_[i] == ',')) ++i;
        if (i >= held_.size()) return out;
        if (held_[i] == '{') {
          start_call(i);
          phase_ = Phase::kArrayCall;
        } else {
          // The array's end, or something that is not a call: an array that gave nothing out
          // is read whole at the end.
          phase_ = held_[i] == ']' || begun_ ? Phase::kDone : Phase::kHold;
        }
        break;
      }
      case Phase::kArrayCall:
        switch (read_call(&out)) {
          case ReadResult::kMore:
            return out;
          case ReadResult::kCall:
            pos_ = call_.scan;
            phase_ = Phase::kArray;
            break;
          case ReadResult::kNotACall:
            phase_ = begun_ ? Phase::kDone : Phase::kHold;
            break;
        }
        break;
      case Phase::kLone:
        switch (read_call(&out)) {
          case ReadResult::kMore:
            return out;
          case ReadResult::kCall:
            phase_ = Phase::kDone;
            break;
          case ReadResult::kNotACall:
            phase_ = Phase::kHold;
            break;
        }
        break;
      case Phase::kLlamaStart: {
        // A call is the whole message, decided by its first bytes: `{`, or the python tag.
        size_t i = skip_ws(0);
        if (i >= held_.size()) return out;
        Cursor c{held_, i};
        const Match tag = c.lit(kPythonTag);
        if (tag == Match::kMore) return out;
        if (tag == Match::kYes) {
          i = skip_ws(c.i);
          if (i >= held_.size()) return out;
        }
        if (held_[i] == '{') {
          start_call(i);
          phase_ = Phase::kLone;
        } else if (tag == Match::kYes) {
          phase_ = Phase::kHold;
        } else {
          emit_content(&out, held_);  // not a call: plain text from here on
          held_.clear();
          phase_ = Phase::kPass;
          return out;
        }
        break;
      }
      case Phase::kGenericStart: {
        bool calls = false;
        size_t end = 0;
        const Match m = match_generic_head(held_, &calls, &end);
        if (m == Match::kMore) return out;
        if (m == Match::kNo) {
          phase_ = Phase::kHold;
        } else {
          pos_ = end;
          begun_ = false;
          phase_ = calls ? Phase::kArray : Phase::kResponse;
        }
        break;
      }
      case Phase::kResponse: {
        std::string r;
        const Match m = decode_json_string(held_, &pos_, &r);
        emit_content(&out, r);
        if (m == Match::kMore) return out;
        phase_ = Phase::kDone;
        break;
      }
      case Phase::kDone:
        held_.clear();
        return out;
      case Phase::kHold:
      case Phase::kPass:
        return out;
    }
  }
}

ToolStreamPieces ToolCallStream::finish() {
  ToolStreamPieces out;
  switch (phase_) {
    case Phase::kText:
      emit_content(&out, after_call_ ? ltrim(held_) : std::string_view(held_));
      break;
    case Phase::kPass:
    case Phase::kDone:
    case Phase::kResponse:
      break;
    case Phase::kHold:
    case Phase::kLlamaStart:
    case Phase::kGenericStart:
    case Phase::kHermesOpen:
    case Phase::kHermesCall:
    case Phase::kHermesTail:
    case Phase::kHermesRaw:
    case Phase::kMistralOpen:
    case Phase::kArray:
    case Phase::kArrayCall:
    case Phase::kLone: {
      // A call that went out in part was cut short: the rest of it is dropped. Else what is
      // held is read as the whole reading reads it.
      if (begun_) break;
      ParsedToolOutput po = parse_tool_output(format_, held_);
      if (after_call_ && po.calls.empty()) po.content = std::string(ltrim(po.content));
      push_whole(&out, std::move(po), &pending_ws_);
      break;
    }
  }
  held_.clear();
  phase_ = Phase::kDone;
  return out;
}

}  // namespace metro::server
