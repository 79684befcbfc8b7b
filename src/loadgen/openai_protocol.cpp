#include "loadgen/openai_protocol.h"

#include <nlohmann/json.hpp>

namespace metro::loadgen {
namespace {

using nlohmann::json;

std::string snippet(std::string_view s) {
  constexpr size_t kMax = 120;
  std::string out(s.substr(0, kMax));
  if (s.size() > kMax) out += "...";
  return out;
}

std::optional<Usage> read_usage(const json& j) {
  auto it = j.find("usage");
  if (it == j.end() || !it->is_object()) return std::nullopt;
  Usage u;
  if (auto p = it->find("prompt_tokens"); p != it->end() && p->is_number_integer()) {
    u.prompt_tokens = p->get<int64_t>();
  }
  if (auto c = it->find("completion_tokens"); c != it->end() && c->is_number_integer()) {
    u.completion_tokens = c->get<int64_t>();
  }
  if (auto d = it->find("prompt_tokens_details"); d != it->end() && d->is_object()) {
    if (auto c = d->find("cached_tokens"); c != d->end() && c->is_number_integer()) {
      u.cached_tokens = c->get<int64_t>();
    }
  }
  return u;
}

std::string read_error(const json& j) {
  auto it = j.find("error");
  if (it == j.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto m = it->find("message");
    if (m != it->end() && m->is_string()) return m->get<std::string>();
  }
  return snippet(it->dump());
}

void append_string(const json& obj, const char* key, std::string& out) {
  auto it = obj.find(key);
  if (it != obj.end() && it->is_string()) out += it->get_ref<const std::string&>();
}

// Text of choice 0: `text` (completions), or `delta`/`message` content (chat). Reasoning
// models stream their thinking in `reasoning_content`; those are generated tokens too.
void read_choice(const json& j, const char* chat_field, std::string& text, std::string& finish) {
  auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array() || choices->empty()) return;
  const json& c = (*choices)[0];
  if (!c.is_object()) return;
  append_string(c, "text", text);
  if (auto d = c.find(chat_field); d != c.end() && d->is_object()) {
    append_string(*d, "reasoning_content", text);
    append_string(*d, "content", text);
  }
  if (auto f = c.find("finish_reason"); f != c.end() && f->is_string()) {
    finish = f->get<std::string>();
  }
}

}  // namespace

std::string_view endpoint_name(Endpoint e) {
  return e == Endpoint::kChat ? "chat" : "completions";
}

std::string endpoint_path(std::string_view base_path, Endpoint e) {
  std::string p(base_path);
  while (!p.empty() && p.back() == '/') p.pop_back();
  if (!p.ends_with("/v1")) p += "/v1";
  return p + (e == Endpoint::kChat ? "/chat/completions" : "/completions");
}

std::string models_path(std::string_view base_path) {
  std::string p(base_path);
  while (!p.empty() && p.back() == '/') p.pop_back();
  if (!p.ends_with("/v1")) p += "/v1";
  return p + "/models";
}

std::string request_body(const BodyOptions& o, std::span<const ChatMessage> messages,
                         int64_t max_tokens) {
  json j;
  if (!o.model.empty()) j["model"] = o.model;
  if (o.endpoint == Endpoint::kChat) {
    json arr = json::array();
    for (const auto& m : messages) arr.push_back({{"role", m.role}, {"content", m.content}});
    j["messages"] = std::move(arr);
  } else {
    j["prompt"] = completion_prompt(messages);
  }
  j["max_tokens"] = max_tokens;
  j["stream"] = o.stream;
  if (o.stream && o.include_usage) j["stream_options"] = {{"include_usage", true}};
  if (o.ignore_eos) j["ignore_eos"] = true;
  if (o.temperature) j["temperature"] = *o.temperature;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Expected<StreamChunk> parse_stream_chunk(std::string_view data) {
  json j = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return data_loss("stream chunk is not a JSON object: " + snippet(data));
  }
  StreamChunk c;
  c.error = read_error(j);
  read_choice(j, "delta", c.text, c.finish_reason);
  c.usage = read_usage(j);
  return c;
}

Expected<Completion> parse_completion(std::string_view body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return data_loss("response body is not a JSON object: " + snippet(body));
  }
  if (std::string e = read_error(j); !e.empty()) return data_loss("server error: " + e);
  if (!j.contains("choices")) return data_loss("response has no \"choices\": " + snippet(body));
  Completion c;
  read_choice(j, "message", c.text, c.finish_reason);
  c.usage = read_usage(j);
  return c;
}

Expected<std::string> parse_first_model_id(std::string_view body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return data_loss("/v1/models: not a JSON object");
  auto data = j.find("data");
  if (data == j.end() || !data->is_array() || data->empty() || !(*data)[0].is_object()) {
    return not_found("/v1/models lists no model; pass --model");
  }
  auto id = (*data)[0].find("id");
  if (id == (*data)[0].end() || !id->is_string()) return data_loss("/v1/models: model without an id");
  return id->get<std::string>();
}

}  // namespace metro::loadgen
