#include "server/openai_responses.h"

#include "server/json_util.h"
#include "server/openai_response.h"
#include "server/request_id.h"
#include "server/response_store.h"

namespace metro::server {

namespace {

using OJson = nlohmann::ordered_json;

// Chat fields metro takes that the Responses API has no name for: passed through as given.
constexpr const char* kPassThrough[] = {"temperature", "top_p",      "seed",      "stop",
                                        "top_k",       "min_p",      "presence_penalty",
                                        "frequency_penalty",         "repetition_penalty",
                                        "logit_bias",  "user",       "metro",     "metro_class",
                                        "metro_deadline_ms"};

// A message item's content: a string, or text parts joined.
ApiResult<std::string> item_text(const OJson& content, size_t index) {
  const std::string where = "input[" + std::to_string(index) + "].content";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return bad_request(where + " must be a string or an array of text parts", "input");
  std::string text;
  for (const OJson& part : content) {
    if (!part.is_object()) return bad_request(where + " parts must be objects", "input");
    const auto type = part.find("type");
    const std::string t = type != part.end() && type->is_string() ? type->get<std::string>() : "";
    if (t != "input_text" && t != "output_text" && t != "text") {
      return bad_request(where + ": content parts of type '" + sanitize_utf8(t.substr(0, 64)) +
                             "' are not supported; send input_text",
                         "input");
    }
    const auto tx = part.find("text");
    if (tx == part.end() || !tx->is_string()) return bad_request(where + ": a text part needs a string 'text'", "input");
    text += tx->get<std::string>();
  }
  return text;
}

// `input` as chat messages.
ApiResult<nlohmann::json> input_messages(const OJson& input) {
  nlohmann::json out = nlohmann::json::array();
  if (input.is_string()) {
    out.push_back({{"role", "user"}, {"content", input.get<std::string>()}});
    return out;
  }
  if (!input.is_array()) return bad_request("input must be a string or an array of input items", "input");
  for (size_t i = 0; i < input.size(); ++i) {
    const OJson& item = input[i];
    if (!item.is_object()) return bad_request("input[" + std::to_string(i) + "] must be an object", "input");
    const auto type = item.find("type");
    if (type != item.end() && !(type->is_string() && type->get<std::string>() == "message")) {
      const std::string t = type->is_string() ? type->get<std::string>() : type->dump();
      return bad_request("input items of type '" + sanitize_utf8(t.substr(0, 64)) +
                             "' are not supported; send messages",
                         "input");
    }
    const auto role = item.find("role");
    std::string r = role != item.end() && role->is_string() ? role->get<std::string>() : "";
    if (r == "developer") r = "system";
    if (r != "user" && r != "assistant" && r != "system") {
      return bad_request("input[" + std::to_string(i) + "].role must be user, assistant, system or developer",
                         "input");
    }
    const auto content = item.find("content");
    if (content == item.end()) return bad_request("input[" + std::to_string(i) + "] has no content", "input");
    auto text = item_text(*content, i);
    if (!text.ok()) return text.error();
    out.push_back({{"role", r}, {"content", std::move(*text)}});
  }
  if (out.empty()) return bad_request("input must not be empty", "input");
  return out;
}

// The chat parser's names for what a Responses request calls otherwise.
std::string responses_param(const std::string& chat_param) {
  if (chat_param == "messages") return "input";
  if (chat_param == "max_tokens") return "max_output_tokens";
  if (chat_param.rfind("response_format", 0) == 0) return "text.format";
  return chat_param;
}


}  // namespace

ApiResult<PreparedCall> prepare_responses(const OJson& body, const PromptContext& ctx, const CallContext& call) {
  if (auto t = body.find("tools"); t != body.end() && !t->is_null() && !(t->is_array() && t->empty())) {
    return bad_request("tools are not supported on /v1/responses yet; call tools through /v1/chat/completions",
                       "tools");
  }
  if (auto b = body.find("background"); b != body.end() && b->is_boolean() && b->get<bool>()) {
    return bad_request("background responses are not supported", "background");
  }
  auto rc = std::make_shared<ResponsesCall>();
  rc->tenant = call.tenant;
  OJson& echo = rc->echo;
  bool store = true;
  if (auto s = body.find("store"); s != body.end() && !s->is_null()) {
    if (!s->is_boolean()) return bad_request("store must be a boolean", "store");
    store = s->get<bool>();
  }

  OJson chat = OJson::object();
  if (auto m = body.find("model"); m != body.end()) chat["model"] = *m;
  nlohmann::json messages = nlohmann::json::array();
  OJson instructions = nullptr;
  if (auto in = body.find("instructions"); in != body.end() && !in->is_null()) {
    if (!in->is_string()) return bad_request("instructions must be a string", "instructions");
    instructions = *in;
    messages.push_back({{"role", "system"}, {"content", in->get<std::string>()}});
  }
  nlohmann::json conversation = nlohmann::json::array();
  OJson previous = nullptr;
  if (auto p = body.find("previous_response_id"); p != body.end() && !p->is_null()) {
    if (!p->is_string()) return bad_request("previous_response_id must be a string", "previous_response_id");
    const std::string id = p->get<std::string>();
    std::shared_ptr<const ResponseStore::Entry> prev = ctx.responses ? ctx.responses->get(call.tenant, id) : nullptr;
    if (!prev) {
      return not_found_error("Previous response with id '" + sanitize_utf8(id.substr(0, 128)) + "' not found.",
                             "previous_response_id", "previous_response_not_found");
    }
    conversation = prev->conversation;
    previous = *p;
  }
  const auto input = body.find("input");
  if (input == body.end() || input->is_null()) return bad_request("input is required", "input");
  auto turn = input_messages(*input);
  if (!turn.ok()) return turn.error();
  for (auto& m : *turn) conversation.push_back(std::move(m));
  for (const auto& m : conversation) messages.push_back(m);
  chat["messages"] = OJson::parse(messages.dump());

  if (auto v = body.find("max_output_tokens"); v != body.end()) chat["max_tokens"] = *v;
  for (const char* k : kPassThrough) {
    if (auto v = body.find(k); v != body.end()) chat[k] = *v;
  }
  if (auto v = body.find("stream"); v != body.end()) chat["stream"] = *v;
  OJson format = OJson{{"type", "text"}};
  if (auto t = body.find("text"); t != body.end() && !t->is_null()) {
    if (!t->is_object()) return bad_request("text must be an object", "text");
    if (auto f = t->find("format"); f != t->end() && !f->is_null()) {
      const auto type = f->is_object() ? f->find("type") : f->end();
      const std::string ty = f->is_object() && type != f->end() && type->is_string() ? type->get<std::string>() : "";
      if (ty == "json_object") {
        chat["response_format"] = OJson{{"type", "json_object"}};
      } else if (ty == "json_schema") {
        OJson js = OJson::object();
        for (const char* k : {"name", "schema", "strict", "description"}) {
          if (auto v = f->find(k); v != f->end()) js[k] = *v;
        }
        chat["response_format"] = OJson{{"type", "json_schema"}, {"json_schema", std::move(js)}};
      } else if (ty != "text") {
        return bad_request("text.format.type must be text, json_object or json_schema", "text.format");
      }
      format = *f;
    }
  }

  const nlohmann::json chat_body = nlohmann::json::parse(chat.dump());
  PromptContext with_order = ctx;
  with_order.ordered_body = &chat;
  ApiResult<PreparedCall> r = prepare_parsed_request(Endpoint::kChatCompletions, chat_body, with_order, call);
  if (!r.ok()) {
    ApiError e = r.error();
    e.param = responses_param(e.param);
    return e;
  }
  echo["instructions"] = instructions;
  echo["max_output_tokens"] = body.contains("max_output_tokens") ? body["max_output_tokens"] : OJson(nullptr);
  echo["previous_response_id"] = previous;
  echo["temperature"] = body.contains("temperature") && body["temperature"].is_number() ? body["temperature"] : OJson(1.0);
  echo["top_p"] = body.contains("top_p") && body["top_p"].is_number() ? body["top_p"] : OJson(1.0);
  echo["store"] = store;
  echo["metadata"] = body.contains("metadata") && body["metadata"].is_object() ? body["metadata"] : OJson::object();
  echo["text"] = OJson{{"format", format}};
  echo["user"] = body.contains("user") && body["user"].is_string() ? body["user"] : OJson(nullptr);
  rc->conversation = std::move(conversation);
  rc->store = store ? ctx.responses : nullptr;
  r->spec.endpoint = Endpoint::kResponses;
  r->spec.responses = std::move(rc);
  return r;
}

// ResponseFormatter's Responses API shapes.

std::string ResponseFormatter::responses_event(OJson ev) {
  ev["sequence_number"] = responses_seq_++;
  const std::string type = ev["type"].get<std::string>();
  return "event: " + type + "\ndata: " + dump_json(ev) + "\n\n";
}

OJson ResponseFormatter::responses_message(const char* status) const {
  const ChoiceState& c = choices_[0];
  OJson content = OJson::array();
  if (std::string(status) != "in_progress") {
    content.push_back(OJson{{"type", "output_text"}, {"text", c.text}, {"annotations", OJson::array()},
                            {"logprobs", OJson::array()}});
  }
  return OJson{{"id", message_id_}, {"type", "message"}, {"status", status}, {"role", "assistant"},
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
  if (st == "completed" || st == "incomplete") output.push_back(responses_message(status));
  r["output"] = std::move(output);
  r["parallel_tool_calls"] = true;
  r["previous_response_id"] = echo["previous_response_id"];
  r["reasoning"] = OJson{{"effort", nullptr}, {"summary", nullptr}};
  r["store"] = echo["store"];
  r["temperature"] = echo["temperature"];
  r["text"] = echo["text"];
  r["tool_choice"] = "auto";
  r["tools"] = OJson::array();
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

// The events before the first piece of text: the response, its message, its text part.
std::string ResponseFormatter::responses_open() {
  responses_open_ = true;
  if (message_id_.empty()) message_id_ = random_id("msg_");
  std::string out;
  out += responses_event(OJson{{"type", "response.created"}, {"response", responses_object("in_progress")}});
  out += responses_event(OJson{{"type", "response.in_progress"}, {"response", responses_object("in_progress")}});
  out += responses_event(
      OJson{{"type", "response.output_item.added"}, {"output_index", 0}, {"item", responses_message("in_progress")}});
  out += responses_event(OJson{{"type", "response.content_part.added"},
                               {"item_id", message_id_},
                               {"output_index", 0},
                               {"content_index", 0},
                               {"part", OJson{{"type", "output_text"}, {"text", ""}, {"annotations", OJson::array()}}}});
  return out;
}

void ResponseFormatter::responses_delta(const std::string& text, std::string* out) {
  if (!responses_open_) *out += responses_open();
  if (text.empty()) return;
  *out += responses_event(OJson{{"type", "response.output_text.delta"},
                                {"item_id", message_id_},
                                {"output_index", 0},
                                {"content_index", 0},
                                {"delta", text},
                                {"logprobs", OJson::array()}});
}

std::string ResponseFormatter::responses_finish() {
  if (message_id_.empty()) message_id_ = random_id("msg_");
  const ChoiceState& c = choices_[0];
  const char* status = failure_ ? "failed" : c.finish_reason == "length" ? "incomplete" : "completed";
  OJson resp = responses_object(status);
  const ResponsesCall& rc = *spec_.responses;
  if (rc.store != nullptr && !failure_) {
    nlohmann::json conversation = rc.conversation;
    conversation.push_back({{"role", "assistant"}, {"content", c.text}});
    rc.store->put(rc.tenant, id_, std::move(conversation), dump_json(resp));
  }
  if (!spec_.stream) return dump_json(resp);
  std::string out;
  if (!responses_open_) out += responses_open();
  if (failure_) {
    out += responses_event(OJson{{"type", "response.failed"}, {"response", std::move(resp)}});
    return out;
  }
  const OJson part = OJson{{"type", "output_text"}, {"text", c.text}, {"annotations", OJson::array()}};
  out += responses_event(OJson{{"type", "response.output_text.done"},
                               {"item_id", message_id_},
                               {"output_index", 0},
                               {"content_index", 0},
                               {"text", c.text},
                               {"logprobs", OJson::array()}});
  out += responses_event(OJson{{"type", "response.content_part.done"},
                               {"item_id", message_id_},
                               {"output_index", 0},
                               {"content_index", 0},
                               {"part", part}});
  out += responses_event(
      OJson{{"type", "response.output_item.done"}, {"output_index", 0}, {"item", responses_message(status)}});
  const std::string last = std::string(status) == "incomplete" ? "response.incomplete" : "response.completed";
  out += responses_event(OJson{{"type", last}, {"response", std::move(resp)}});
  return out;
}

}  // namespace metro::server
