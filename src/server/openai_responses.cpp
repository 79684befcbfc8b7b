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
    const std::string where = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) return bad_request(where + " must be an object", "input");
    const auto type = item.find("type");
    const std::string t = type == item.end() ? "message" : type->is_string() ? type->get<std::string>() : type->dump();
    auto string_field = [&](const char* k) -> ApiResult<std::string> {
      const auto v = item.find(k);
      if (v == item.end() || !v->is_string()) return bad_request(where + "." + k + " must be a string", "input");
      return v->get<std::string>();
    };
    if (t == "function_call") {
      // A call the model made: an assistant turn with tool_calls (consecutive calls, one turn).
      auto call_id = string_field("call_id");
      if (!call_id.ok()) return call_id.error();
      auto name = string_field("name");
      if (!name.ok()) return name.error();
      auto args = string_field("arguments");
      if (!args.ok()) return args.error();
      nlohmann::json call = {{"id", *call_id}, {"type", "function"}, {"function", {{"name", *name}, {"arguments", *args}}}};
      if (!out.empty() && out.back()["role"] == "assistant" && out.back().contains("tool_calls")) {
        out.back()["tool_calls"].push_back(std::move(call));
      } else {
        out.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", nlohmann::json::array({call})}});
      }
      continue;
    }
    if (t == "function_call_output") {
      auto call_id = string_field("call_id");
      if (!call_id.ok()) return call_id.error();
      auto output = string_field("output");
      if (!output.ok()) return output.error();
      out.push_back({{"role", "tool"}, {"tool_call_id", *call_id}, {"content", *output}});
      continue;
    }
    if (t != "message") {
      return bad_request("input items of type '" + sanitize_utf8(t.substr(0, 64)) +
                             "' are not supported; send message, function_call or function_call_output items",
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
  if (chat_param.rfind("tool_choice", 0) == 0 || chat_param.rfind("tools[", 0) == 0) {
    // The Responses shape has no `function` level: tools[1].function.name is tools[1].name.
    std::string p = chat_param;
    if (const size_t at = p.find(".function."); at != std::string::npos) p.erase(at, std::string(".function").size());
    return p;
  }
  return chat_param;
}

// `tools` (Responses shape: {"type": "function", "name", "description", "parameters",
// "strict"}) in the chat shape; function tools only.
ApiResult<OJson> chat_tools(const OJson& tools) {
  if (!tools.is_array()) return bad_request("tools must be an array", "tools");
  OJson out = OJson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const OJson& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return bad_request(where + " must be an object", "tools");
    const auto type = t.find("type");
    const std::string ty = type != t.end() && type->is_string() ? type->get<std::string>() : "";
    if (ty != "function") {
      return bad_request(where + ": tools of type '" + sanitize_utf8(ty.substr(0, 64)) +
                             "' are not supported; only function tools are",
                         "tools");
    }
    OJson fn = OJson::object();
    for (const char* k : {"name", "description", "parameters", "strict"}) {
      if (auto v = t.find(k); v != t.end() && !v->is_null()) fn[k] = *v;
    }
    out.push_back(OJson{{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

// `tool_choice` in the chat shape: the strings as they are, {"type": "function", "name"}
// as {"type": "function", "function": {"name"}}.
ApiResult<OJson> chat_tool_choice(const OJson& choice) {
  if (choice.is_string()) return choice;
  if (choice.is_object()) {
    const auto type = choice.find("type");
    const auto name = choice.find("name");
    if (type != choice.end() && *type == "function" && name != choice.end() && name->is_string()) {
      return OJson{{"type", "function"}, {"function", OJson{{"name", *name}}}};
    }
  }
  return bad_request(
      "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": NAME}",
      "tool_choice");
}

}  // namespace

ApiResult<PreparedCall> prepare_responses(const OJson& body, const PromptContext& ctx, const CallContext& call) {
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
  OJson tools_echo = OJson::array();
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    auto tools = chat_tools(*t);
    if (!tools.ok()) return tools.error();
    if (!tools->empty()) chat["tools"] = std::move(*tools);
    tools_echo = *t;
  }
  OJson choice_echo = "auto";
  if (auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    auto choice = chat_tool_choice(*c);
    if (!choice.ok()) return choice.error();
    chat["tool_choice"] = std::move(*choice);
    choice_echo = *c;
  }
  if (auto v = body.find("parallel_tool_calls"); v != body.end()) chat["parallel_tool_calls"] = *v;
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
  echo["tools"] = std::move(tools_echo);
  echo["tool_choice"] = std::move(choice_echo);
  echo["parallel_tool_calls"] =
      body.contains("parallel_tool_calls") && body["parallel_tool_calls"].is_boolean() ? body["parallel_tool_calls"]
                                                                                       : OJson(true);
  rc->conversation = std::move(conversation);
  rc->store = store ? ctx.responses : nullptr;
  r->spec.endpoint = Endpoint::kResponses;
  r->spec.responses = std::move(rc);
  return r;
}

}  // namespace metro::server
