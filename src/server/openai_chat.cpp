// Chat messages -> prompt tokens through the model's chat template.
#include <algorithm>
#include <random>

#include "server/json_util.h"
#include "server/openai_request.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/special_split.h"

namespace metro::server::detail {

bool has_control_text(const tokenizer::Tokenizer& tok, std::string_view text) {
  if (text.size() >= (1ull << 32)) return true;
  std::vector<tokenizer::Fragment> frags;
  tokenizer::split_special(tok.vocab(), text, /*parse_special=*/true, frags);
  return std::any_of(frags.begin(), frags.end(),
                     [&](const tokenizer::Fragment& f) { return f.is_token() && tok.is_control(f.token); });
}

ApiResult<std::vector<int32_t>> tokenize_rendered(const tokenizer::Tokenizer& tok, const std::string& rendered,
                                                  const std::vector<ProtectedContent>& protected_contents) {
  std::vector<int32_t> ids;
  const int32_t bos = tok.bos_id();
  if (tok.add_bos() && bos >= 0) {
    const std::string bos_text = tok.token_to_piece(bos);
    if (bos_text.empty() || rendered.compare(0, bos_text.size(), bos_text) != 0) ids.push_back(bos);
  }
  // (position, which) of every placeholder, each required exactly once.
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t k = 0; k < protected_contents.size(); ++k) {
    const std::string& ph = protected_contents[k].placeholder;
    const size_t pos = rendered.find(ph);
    if (pos == std::string::npos || rendered.find(ph, pos + 1) != std::string::npos) {
      return bad_request(
          "a message's content contains special-token text, which this chat template cannot keep "
          "apart from its own markup; remove it",
          "messages");
    }
    spans.emplace_back(pos, k);
  }
  std::sort(spans.begin(), spans.end());
  auto append = [&](std::string_view text, bool parse_special) {
    if (text.empty()) return;
    auto part = tok.encode(text, /*add_special=*/false, parse_special);
    ids.insert(ids.end(), part.begin(), part.end());
  };
  size_t cursor = 0;
  for (const auto& [pos, k] : spans) {
    if (pos < cursor) return bad_request("overlapping message contents in the rendered prompt", "messages");
    append(std::string_view(rendered).substr(cursor, pos - cursor), true);
    append(protected_contents[k].text, false);
    cursor = pos + protected_contents[k].placeholder.size();
  }
  append(std::string_view(rendered).substr(cursor), true);
  return ids;
}

namespace {

constexpr size_t kMaxFieldBytes = 256;

std::string at(size_t i) { return "messages[" + std::to_string(i) + "]"; }

// The text of a content value: a string, or the text parts of a list joined with "\n".
ApiResult<std::string> content_text(const nlohmann::json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return bad_request(param + " must be a string or an array of content parts", param);
  std::string text;
  bool first = true;
  for (const auto& part : content) {
    if (!part.is_object()) return bad_request(param + " parts must be objects", param);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string() || *type != "text") {
      return bad_request("only text content parts ({\"type\": \"text\", \"text\": ...}) are supported", param);
    }
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) return bad_request(param + " text parts need a string `text`", param);
    if (!first) text += "\n";
    text += t->get_ref<const std::string&>();
    first = false;
  }
  return text;
}

// An assistant message's tool_calls as templates read them: each {"id", "type": "function",
// "function": {"name", "arguments"}} with the arguments a JSON object (OpenAI sends them as
// a JSON string; the templates of models trained on tool calls render an object).
ApiResult<nlohmann::ordered_json> normalize_tool_calls(const nlohmann::json& calls, const std::string& p) {
  if (!calls.is_array()) return bad_request(p + " must be an array", p);
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    const std::string q = p + "[" + std::to_string(k) + "]";
    const nlohmann::json& c = calls[k];
    if (!c.is_object()) return bad_request(q + " must be an object", q);
    auto fn = c.find("function");
    if (fn == c.end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
      return bad_request(q + ".function.name is required", q + ".function.name");
    }
    nlohmann::ordered_json args = nlohmann::ordered_json::object();
    if (auto a = fn->find("arguments"); a != fn->end() && !a->is_null()) {
      if (a->is_string()) {
        args = nlohmann::ordered_json::parse(a->get<std::string>(), nullptr, /*allow_exceptions=*/false);
        if (args.is_discarded()) args = a->get<std::string>();  // not JSON: passed on as the text it is
      } else {
        args = nlohmann::ordered_json(*a);
      }
    }
    nlohmann::ordered_json call = nlohmann::ordered_json::object();
    if (auto id = c.find("id"); id != c.end() && id->is_string()) call["id"] = *id;
    call["type"] = "function";
    call["function"] = {{"name", (*fn)["name"]}, {"arguments", std::move(args)}};
    out.push_back(std::move(call));
  }
  return out;
}

}  // namespace

ApiResult<std::vector<int32_t>> chat_prompt(const nlohmann::json& body, const PromptContext& ctx,
                                            const ToolRequest* tools) {
  const bool generic_tools = tools != nullptr && tools->format == ToolFormat::kGeneric;
  if (ctx.chat_template == nullptr) return bad_request("this model has no chat template; use /v1/completions");
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) return bad_request("messages is required", "messages");
  if (!it->is_array()) return bad_request("messages must be an array of message objects", "messages");
  if (it->empty()) return bad_request("messages must not be empty", "messages");
  if (it->size() > static_cast<size_t>(ctx.limits.max_messages)) {
    return bad_request("messages may hold at most " + std::to_string(ctx.limits.max_messages) + " messages",
                       "messages");
  }
  std::mt19937_64 rng(std::random_device{}());
  const std::string nonce = std::to_string(rng());
  std::vector<ProtectedContent> protected_contents;
  size_t content_bytes = 0;  // of every message so far, for the bound before tokenizing
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  size_t i = 0;
  for (const auto& m : *it) {
    const std::string p = at(i);
    if (!m.is_object()) return bad_request(p + " must be an object", p);
    std::optional<ApiError> err;
    auto role = get_string(m, "role", kMaxFieldBytes, &err);
    if (err) {
      err->param = p + ".role";
      return *err;
    }
    if (!role) return bad_request(p + ".role is required", p + ".role");
    if (*role == "developer") role = "system";
    if (*role != "system" && *role != "user" && *role != "assistant" && *role != "tool") {
      return bad_request(p + ".role must be system, developer, user, assistant or tool", p + ".role");
    }
    nlohmann::ordered_json msg = nlohmann::ordered_json::object();
    msg["role"] = *role;
    auto content = m.find("content");
    const bool has_tool_calls = m.contains("tool_calls") && !m["tool_calls"].is_null();
    if (content == m.end() || content->is_null()) {
      if (*role != "assistant" || !has_tool_calls) return bad_request(p + ".content is required", p + ".content");
      msg["content"] = "";
    } else {
      auto text = content_text(*content, p + ".content");
      if (!text.ok()) return text.error();
      content_bytes += text->size();
      if (auto e = check_prompt_bytes(content_bytes, ctx, "messages")) return *e;
      if (has_control_text(*ctx.tokenizer, *text)) {
        ProtectedContent pc{
            "\x1f"
            "metro-content-" +
                nonce + "-" + std::to_string(i) + "\x1f",
            std::move(*text)};
        msg["content"] = pc.placeholder;
        protected_contents.push_back(std::move(pc));
      } else {
        msg["content"] = *content;
      }
    }
    if (auto name = get_string(m, "name", kMaxFieldBytes, &err)) msg["name"] = *name;
    if (err) return *err;
    if (auto id = get_string(m, "tool_call_id", kMaxFieldBytes, &err)) msg["tool_call_id"] = *id;
    if (err) return *err;
    if (has_tool_calls) {
      auto calls = normalize_tool_calls(m["tool_calls"], p + ".tool_calls");
      if (!calls.ok()) return calls.error();
      if (generic_tools && msg["content"] == "") {
        // The generic format's own words for calls, so the model sees what it called.
        nlohmann::ordered_json envelope = nlohmann::ordered_json::array();
        for (const auto& c : *calls) {
          envelope.push_back({{"name", c["function"]["name"]}, {"arguments", c["function"]["arguments"]}});
        }
        msg["content"] = nlohmann::ordered_json{{"tool_calls", envelope}}.dump();
      }
      msg["tool_calls"] = std::move(*calls);
    }
    messages.push_back(std::move(msg));
    ++i;
  }
  tokenizer::ChatTemplateOptions opts;
  opts.add_generation_prompt = true;
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (!t->is_array()) return bad_request("tools must be an array", "tools");
    const nlohmann::ordered_json* sent = nullptr;
    if (ctx.ordered_body != nullptr) {
      if (auto ot = ctx.ordered_body->find("tools"); ot != ctx.ordered_body->end() && ot->is_array()) sent = &*ot;
    }
    opts.tools = sent != nullptr ? *sent : nlohmann::ordered_json(*t);
  }
  if (generic_tools && tools->parses()) {
    // The template knows no tools: a system message tells the model about them.
    const std::string text = generic_tool_instructions(*tools);
    if (!messages.empty() && messages[0]["role"] == "system" && messages[0]["content"].is_string()) {
      messages[0]["content"] = messages[0]["content"].get<std::string>() + "\n\n" + text;
    } else {
      messages.insert(messages.begin(), nlohmann::ordered_json{{"role", "system"}, {"content", text}});
    }
  }
  auto rendered = ctx.chat_template->render(messages, opts);
  if (!rendered.ok()) {
    return bad_request("the chat template could not render these messages: " + rendered.status().message(), "messages");
  }
  return tokenize_rendered(*ctx.tokenizer, *rendered, protected_contents);
}

}  // namespace metro::server::detail
