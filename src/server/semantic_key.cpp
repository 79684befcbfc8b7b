#include "server/semantic_key.h"

#include "cache/semantic_cache.h"

namespace metro::server {

namespace {

// The text of a message's content: a string, or the text parts of an array.
std::string content_text(const nlohmann::json& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string out;
  if (content.is_array()) {
    for (const auto& part : content) {
      if (part.is_object() && part.value("type", std::string()) == "text" && part.contains("text") &&
          part["text"].is_string()) {
        out += part["text"].get<std::string>();
      }
    }
  }
  return out;
}

bool is_system(const nlohmann::json& m) {
  const std::string role = m.is_object() ? m.value("role", std::string()) : std::string();
  return role == "system" || role == "developer";
}

}  // namespace

ApiResult<bool> asks_semantic_cache(const nlohmann::json& body) {
  auto m = body.find("metro");
  if (m == body.end() || !m->is_object()) return false;
  auto f = m->find("semantic_cache");
  if (f == m->end() || f->is_null()) return false;
  if (!f->is_boolean()) return bad_request("metro.semantic_cache must be a boolean", "metro.semantic_cache");
  return f->get<bool>();
}

std::optional<SemanticKey> semantic_key(Endpoint endpoint, const nlohmann::json& body, const PreparedCall& pc,
                                        const std::string& tenant, const std::string& model_id, std::string* why) {
  auto no = [&](const char* reason) -> std::optional<SemanticKey> {
    if (why != nullptr) *why = reason;
    return std::nullopt;
  };
  if (endpoint != Endpoint::kChatCompletions && endpoint != Endpoint::kCompletions) return no("not chat or completions");
  if (pc.requests.size() != 1 || pc.spec.n != 1) return no("several prompts or choices");
  const engine::Request& r = pc.requests.front();
  if (r.kind != engine::RequestKind::kGenerate) return no("not a generation");
  if (r.sampling.logprobs || r.sampling.top_logprobs > 0 || pc.spec.logprobs >= 0 || pc.spec.chat_logprobs) {
    return no("log-probabilities asked for");
  }
  if (r.sampling.temperature > 0.0f && !r.sampling.has_seed) return no("sampling without a seed");
  // Everything but the text and the fields that only shape delivery must match exactly.
  nlohmann::json rest = body;
  for (const char* k : {"stream", "stream_options", "user", "messages", "prompt"}) rest.erase(k);
  if (auto m = rest.find("metro"); m != rest.end() && m->is_object()) m->erase("semantic_cache");
  SemanticKey key;
  if (endpoint == Endpoint::kChatCompletions) {
    const auto it = body.find("messages");
    if (it == body.end() || !it->is_array()) return no("no messages");
    nlohmann::json system = nlohmann::json::array();
    for (const auto& m : *it) {
      if (is_system(m)) {
        system.push_back(m);
        continue;
      }
      if (!key.text.empty()) key.text += "\n";
      key.text += content_text(m.is_object() && m.contains("content") ? m["content"] : nlohmann::json());
    }
    rest["messages"] = std::move(system);
  } else {
    const auto it = body.find("prompt");
    if (it == body.end() || !it->is_string()) return no("the prompt is not one string");
    key.text = it->get<std::string>();
  }
  if (key.text.empty()) return no("no text to compare");
  // nlohmann::json keeps object keys sorted: the dump is canonical.
  key.ns = cache::namespace_key({tenant, model_id, endpoint_path(endpoint), rest.dump()});
  return key;
}

}  // namespace metro::server
