// ResponseFormatter's shapes for /v1/responses: the response object, its output items (a
// message, and with tools a function_call item per call), and the typed events of its stream.
#include "server/json_util.h"
#include "server/openai_response.h"
#include "server/openai_responses.h"
#include "server/request_id.h"
#include "server/response_store.h"
#include "server/tool_calls.h"

namespace metro::server {

using OJson = nlohmann::ordered_json;

std::string ResponseFormatter::responses_event(OJson ev) {
  ev["sequence_number"] = responses_seq_++;
  const std::string type = ev["type"].get<std::string>();
  return "event: " + type + "\ndata: " + dump_json(ev) + "\n\n";
}

OJson ResponseFormatter::responses_item(const ResponsesItem& item) const {
  if (item.call) {
    return OJson{{"type", "function_call"}, {"id", item.id},           {"call_id", item.call_id},
                 {"name", item.name},       {"arguments", item.text}, {"status", item.status}};
  }
  OJson content = OJson::array();
  if (item.status != "in_progress") {
    content.push_back(OJson{{"type", "output_text"}, {"text", item.text}, {"annotations", OJson::array()},
                            {"logprobs", OJson::array()}});
  }
  return OJson{{"id", item.id},
               {"type", "message"},
               {"status", item.status},
               {"role", "assistant"},
               {"content", std::move(content)}};
}

OJson ResponseFormatter::responses_object(const char* status) const {
  const OJson& echo = spec_.responses->echo;
  const std::string st = status;
  OJson r = OJson::object();
  r["id"] = id_;
  r["object"] = "response";
  r["created_at"] = created_;
  r["status"] = status;
  r["background"] = false;
  r["error"] = nullptr;
  if (st == "failed" && failure_) r["error"] = OJson{{"code", failure_->code}, {"message", failure_->message}};
  r["incomplete_details"] = st == "incomplete" ? OJson{{"reason", "max_output_tokens"}} : OJson(nullptr);
  r["instructions"] = echo["instructions"];
  r["max_output_tokens"] = echo["max_output_tokens"];
  r["model"] = spec_.model;
  OJson output = OJson::array();
  if (st == "completed" || st == "incomplete") {
    for (const ResponsesItem& item : resp_items_) output.push_back(responses_item(item));
  }
  r["output"] = std::move(output);
  r["parallel_tool_calls"] = echo["parallel_tool_calls"];
  r["previous_response_id"] = echo["previous_response_id"];
  r["reasoning"] = OJson{{"effort", nullptr}, {"summary", nullptr}};
  r["store"] = echo["store"];
  r["temperature"] = echo["temperature"];
  r["text"] = echo["text"];
  r["tool_choice"] = echo["tool_choice"];
  r["tools"] = echo["tools"];
  r["top_p"] = echo["top_p"];
  r["truncation"] = "disabled";
  if (st == "completed" || st == "incomplete") {
    r["usage"] = OJson{{"input_tokens", usage_.prompt_tokens},
                       {"input_tokens_details", OJson{{"cached_tokens", usage_.cached_prompt_tokens}}},
                       {"output_tokens", usage_.completion_tokens},
                       {"output_tokens_details", OJson{{"reasoning_tokens", 0}}},
                       {"total_tokens", usage_.prompt_tokens + usage_.completion_tokens}};
  } else {
    r["usage"] = nullptr;
  }
  r["user"] = echo["user"];
  r["metadata"] = echo["metadata"];
  r["system_fingerprint"] = system_fingerprint(static_cast<uint8_t>(tiers_seen_ | usage_.tiers), spec_.variant);
  return r;
}

// The events before the first output item: the response, created and in progress.
std::string ResponseFormatter::responses_open() {
  responses_open_ = true;
  std::string out;
  out += responses_event(OJson{{"type", "response.created"}, {"response", responses_object("in_progress")}});
  out += responses_event(OJson{{"type", "response.in_progress"}, {"response", responses_object("in_progress")}});
  return out;
}

size_t ResponseFormatter::responses_open_message(std::string* out) {
  if (resp_message_ >= 0) return static_cast<size_t>(resp_message_);
  if (spec_.stream && !responses_open_) *out += responses_open();
  ResponsesItem m;
  m.id = random_id("msg_");
  resp_items_.push_back(m);
  resp_message_ = static_cast<int>(resp_items_.size() - 1);
  const size_t index = resp_items_.size() - 1;
  if (spec_.stream) {
    *out += responses_event(
        OJson{{"type", "response.output_item.added"}, {"output_index", index}, {"item", responses_item(m)}});
    *out +=
        responses_event(OJson{{"type", "response.content_part.added"},
                              {"item_id", m.id},
                              {"output_index", index},
                              {"content_index", 0},
                              {"part", OJson{{"type", "output_text"}, {"text", ""}, {"annotations", OJson::array()}}}});
  }
  return index;
}

void ResponseFormatter::responses_delta(const std::string& text, std::string* out) {
  if (!responses_open_) *out += responses_open();
  const size_t index = responses_open_message(out);
  if (text.empty()) return;
  resp_items_[index].text += text;
  *out += responses_event(OJson{{"type", "response.output_text.delta"},
                                {"item_id", resp_items_[index].id},
                                {"output_index", index},
                                {"content_index", 0},
                                {"delta", text},
                                {"logprobs", OJson::array()}});
}

void ResponseFormatter::responses_tool_pieces(const ToolStreamPieces& pieces, std::string* out) {
  if (!responses_open_) *out += responses_open();
  for (const ToolStreamPiece& p : pieces) {
    switch (p.kind) {
      case ToolStreamPiece::Kind::kContent:
        // Whitespace around calls is no message of its own.
        if (resp_message_ >= 0 || p.text.find_first_not_of(" \t\r\n") != std::string::npos) {
          responses_delta(sanitize_utf8(p.text), out);
        }
        break;
      case ToolStreamPiece::Kind::kCall: {
        ResponsesItem c;
        c.call = true;
        c.id = random_id("fc_");
        c.call_id = make_tool_call_id();
        c.name = sanitize_utf8(p.text);
        resp_items_.push_back(c);
        *out += responses_event(OJson{{"type", "response.output_item.added"},
                                      {"output_index", resp_items_.size() - 1},
                                      {"item", responses_item(c)}});
        break;
      }
      case ToolStreamPiece::Kind::kArguments: {
        if (resp_items_.empty() || !resp_items_.back().call) break;
        ResponsesItem& c = resp_items_.back();
        const std::string delta = sanitize_utf8(p.text);
        c.text += delta;
        *out += responses_event(OJson{{"type", "response.function_call_arguments.delta"},
                                      {"item_id", c.id},
                                      {"output_index", resp_items_.size() - 1},
                                      {"delta", delta}});
        break;
      }
    }
  }
}

void ResponseFormatter::responses_items_from_text(const std::string& text) {
  std::string content = text;
  std::vector<ToolCall> calls;
  if (spec_.tools) {
    ParsedToolOutput po = parse_tool_output(spec_.tools->format, text);
    calls = std::move(po.calls);
    if (!calls.empty()) content = po.content;
  }
  if (calls.empty() || content.find_first_not_of(" \t\r\n") != std::string::npos) {
    std::string none;
    resp_items_[responses_open_message(&none)].text = sanitize_utf8(content);
  }
  for (ToolCall& tc : calls) {
    ResponsesItem c;
    c.call = true;
    c.id = random_id("fc_");
    c.call_id = make_tool_call_id();
    c.name = sanitize_utf8(tc.name);
    c.text = sanitize_utf8(tc.arguments);
    resp_items_.push_back(std::move(c));
  }
}

std::string ResponseFormatter::responses_finish() {
  ChoiceState& c = choices_[0];
  std::string out;
  if (spec_.stream && c.tool_stream) responses_tool_pieces(c.tool_stream->finish(), &out);
  if (!spec_.stream) responses_items_from_text(c.text);
  const char* status = failure_ ? "failed" : c.finish_reason == "length" ? "incomplete" : "completed";
  // A streamed call that parse_tool_output does not keep was cut short by the length bound.
  const size_t kept_calls =
      spec_.tools ? parse_tool_output(spec_.tools->format, c.text).calls.size() : static_cast<size_t>(0);
  size_t seen_calls = 0;
  bool any_call = false;
  for (ResponsesItem& item : resp_items_) {
    if (item.call) {
      any_call = true;
      item.status = ++seen_calls <= kept_calls ? "completed" : "incomplete";
    } else {
      item.status = status;
    }
  }
  if (resp_items_.empty() && !failure_) {
    // No output at all: an empty message, as a response without tools always has one.
    std::string opened;
    responses_open_message(&opened);
    if (spec_.stream) out += opened;
    resp_items_.back().status = status;
  }
  OJson resp = responses_object(status);
  const ResponsesCall& rc = *spec_.responses;
  if (rc.store != nullptr && !failure_) {
    nlohmann::json conversation = rc.conversation;
    nlohmann::json turn = {{"role", "assistant"}};
    std::string text;
    nlohmann::json calls = nlohmann::json::array();
    for (const ResponsesItem& item : resp_items_) {
      if (!item.call) text += item.text;
      if (item.call && item.status == "completed") {
        calls.push_back({{"id", item.call_id},
                         {"type", "function"},
                         {"function", {{"name", item.name}, {"arguments", item.text}}}});
      }
    }
    turn["content"] = any_call && text.empty() ? nlohmann::json(nullptr) : nlohmann::json(text);
    if (!calls.empty()) turn["tool_calls"] = std::move(calls);
    conversation.push_back(std::move(turn));
    rc.store->put(rc.tenant, id_, std::move(conversation), dump_json(resp));
  }
  if (!spec_.stream) return dump_json(resp);
  if (!responses_open_) out += responses_open();
  if (failure_) {
    out += responses_event(OJson{{"type", "response.failed"}, {"response", std::move(resp)}});
    return out;
  }
  for (size_t i = 0; i < resp_items_.size(); ++i) {
    const ResponsesItem& item = resp_items_[i];
    if (item.call) {
      out += responses_event(OJson{{"type", "response.function_call_arguments.done"},
                                   {"item_id", item.id},
                                   {"output_index", i},
                                   {"arguments", item.text}});
    } else {
      const OJson part = OJson{{"type", "output_text"}, {"text", item.text}, {"annotations", OJson::array()}};
      out += responses_event(OJson{{"type", "response.output_text.done"},
                                   {"item_id", item.id},
                                   {"output_index", i},
                                   {"content_index", 0},
                                   {"text", item.text},
                                   {"logprobs", OJson::array()}});
      out += responses_event(OJson{{"type", "response.content_part.done"},
                                   {"item_id", item.id},
                                   {"output_index", i},
                                   {"content_index", 0},
                                   {"part", part}});
    }
    out += responses_event(
        OJson{{"type", "response.output_item.done"}, {"output_index", i}, {"item", responses_item(item)}});
  }
  const std::string last = std::string(status) == "incomplete" ? "response.incomplete" : "response.completed";
  out += responses_event(OJson{{"type", last}, {"response", std::move(resp)}});
  return out;
}

}  // namespace metro::server
