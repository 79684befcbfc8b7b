#include "tokenizer/chat_template.h"

#include <algorithm>
#include <new>

#include "gguf/gguf.h"
#include "jinja/ast.h"
#include "jinja/interpreter.h"
#include "jinja/lexer.h"
#include "jinja/parser.h"
#include "jinja/string.h"
#include "jinja/value.h"

namespace metro::tokenizer {
namespace {

using jinja::Value;

constexpr std::string_view kChatml =
    "{%- for message in messages -%}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}\n";

// The Gemma turn format, for Gemma files that carry no template: "<start_of_turn>user" or
// "<start_of_turn>model" and a newline, the text, "<end_of_turn>" and a newline; a system
// message has no turn of its own and leads the first user turn, followed by a blank line.
constexpr std::string_view kGemma =
    "{{- bos_token -}}\n"
    "{%- if messages and messages[0]['role'] == 'system' -%}\n"
    "{%- set prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "{%- set turns = messages[1:] -%}\n"
    "{%- else -%}\n"
    "{%- set prefix = '' -%}\n"
    "{%- set turns = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in turns -%}\n"
    "{{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\\n' -}}\n"
    "{{- (prefix if loop.first else '') + (message['content'] | trim) + '<end_of_turn>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<start_of_turn>model\\n' -}}\n"
    "{%- endif -%}\n";

// A needle unlikely to occur in a template, for the content-parts probe.
constexpr std::string_view kProbeText = "MetroContentPartProbe7f3a";
constexpr uint64_t kProbeMaxSteps = 100'000;

Status to_status(const jinja::Error& e, std::string_view source, bool parsing) {
  const std::string where =
      e.offset() == jinja::kNoOffset ? std::string() : " at " + jinja::describe_location(source, e.offset());
  switch (e.kind()) {
    case jinja::ErrorKind::kRaised:
      return invalid_argument(e.what());
    case jinja::ErrorKind::kLimit:
      return resource_exhausted(std::string("chat template") + where + ": " + e.what());
    case jinja::ErrorKind::kSyntax:
      return invalid_argument("chat template syntax error" + where + ": " + e.what());
    default:
      return invalid_argument(std::string(parsing ? "chat template" : "chat template error") + where + ": " +
                              e.what());
  }
}

// The text of list-of-parts content: text parts joined with "\n", as llama.cpp does for
// templates that only take strings.
std::string join_text_parts(const Value& parts) {
  std::string text;
  bool first = true;
  for (const Value& part : parts.items()) {
    if (!part.is_dict()) continue;
    const Value* type = part.dict_data().find("type");
    const Value* t = part.dict_data().find("text");
    if (type != nullptr && !(type->is_string() && type->str() == "text")) continue;
    if (t == nullptr || !t->is_string()) continue;
    if (!first) text += '\n';
    first = false;
    text += t->str();
  }
  return text;
}

Value flatten_content_parts(const Value& messages) {
  if (!messages.is_list()) return messages;
  std::vector<Value> out;
  out.reserve(messages.items().size());
  for (const Value& m : messages.items()) {
    const Value* content = m.is_dict() ? m.dict_data().find("content") : nullptr;
    if (content == nullptr || !content->is_list()) {
      out.push_back(m);
      continue;
    }
    jinja::DictData copy;
    for (const auto& [k, v] : m.dict_data().entries()) {
      copy.set(k, k == "content" ? Value::string(join_text_parts(v)) : v);
    }
    out.push_back(Value::dict(std::move(copy)));
  }
  return Value::list(std::move(out));
}

// Reads the text of a special token id from the vocabulary; "" when absent or invalid.
std::string token_text(const gguf::File& file, std::string_view id_key) {
  if (!file.has(id_key)) return {};
  auto id = file.get_uint(id_key);
  auto tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (!id.ok() || !tokens.ok() || *id >= tokens->size()) return {};
  return std::string((*tokens)[*id]);
}

}  // namespace

nlohmann::ordered_json messages_to_json(const std::vector<ChatMessage>& messages) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    j["role"] = m.role;
    if (!m.content_parts.is_null()) {
      j["content"] = m.content_parts;
    } else {
      j["content"] = m.content;
    }
    if (!m.name.empty()) j["name"] = m.name;
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    if (!m.tool_calls.is_null()) j["tool_calls"] = m.tool_calls;
    out.push_back(std::move(j));
  }
  return out;
}

Expected<ChatTemplate> ChatTemplate::parse(std::string source, const ChatTemplateLimits& limits) {
  if (source.size() > limits.max_source_bytes) {
    return resource_exhausted("chat template is " + std::to_string(source.size()) +
                              " bytes, over the limit of " + std::to_string(limits.max_source_bytes));
  }
  if (!jinja::is_valid_utf8(source)) return invalid_argument("chat template is not valid UTF-8");
  ChatTemplate t;
  try {
    t.program_ = jinja::parse_template(source);
  } catch (const jinja::Error& e) {
    return to_status(e, jinja::normalize_newlines(source), true);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("out of memory while parsing the chat template");
  }
  t.source_ = std::move(source);
  t.limits_ = limits;

  // Does the template print list-of-parts content by itself?
  nlohmann::ordered_json probe = nlohmann::ordered_json::array();
  probe.push_back({{"role", "user"},
                   {"content", nlohmann::ordered_json::array({{{"type", "text"}, {"text", kProbeText}}})}});
  ChatTemplateOptions opts;
  opts.add_generation_prompt = true;
  t.renders_content_parts_ = true;  // render the probe as is
  // One short message needs far fewer steps than a real chat; a hostile template should not
  // cost a full budget at parse time.
  t.limits_.max_steps = std::min<uint64_t>(limits.max_steps, kProbeMaxSteps);
  auto rendered = t.render(probe, opts);
  t.limits_ = limits;
  // Printing the list itself (str() of it, e.g. through `content | trim`) shows the needle
  // inside the part's repr; that is not handling parts.
  const std::string repr = "'text': '" + std::string(kProbeText) + "'";
  t.renders_content_parts_ = rendered.ok() && rendered->find(kProbeText) != std::string::npos &&
                             rendered->find(repr) == std::string::npos;
  return t;
}

Expected<ChatTemplate> ChatTemplate::from_gguf(const gguf::File& file, const ChatTemplateLimits& limits) {
  ChatTemplate t;
  if (const gguf::Value* v = file.find("tokenizer.chat_template")) {
    const auto text = v->as_string();
    if (!text) {
      return invalid_argument("tokenizer.chat_template has type " +
                              std::string(gguf::value_type_name(v->type())) + ", expected a string");
    }
    METRO_ASSIGN_OR_RETURN(t, parse(std::string(*text), limits));
  } else {
    // A family with a turn format of its own gets it; the rest get ChatML.
    const gguf::Value* arch = file.find("general.architecture");
    const auto name = arch != nullptr ? arch->as_string() : std::nullopt;
    if (name && name->starts_with("gemma")) {
      auto g = parse(std::string(kGemma), limits);
      METRO_CHECK_MSG(g.ok(), "the built-in Gemma template must parse");
      t = std::move(g).value();
    } else {
      t = chatml(limits);
    }
    t.is_fallback_ = true;
  }
  t.default_bos_ = token_text(file, "tokenizer.ggml.bos_token_id");
  t.default_eos_ = token_text(file, "tokenizer.ggml.eos_token_id");
  return t;
}

std::string_view ChatTemplate::chatml_source() { return kChatml; }

ChatTemplate ChatTemplate::chatml(const ChatTemplateLimits& limits) {
  auto t = parse(std::string(kChatml), limits);
  METRO_CHECK_MSG(t.ok(), "the built-in ChatML template must parse");
  return std::move(t).value();
}

template <class Json>
Expected<std::string> ChatTemplate::render_json(const Json& messages, const ChatTemplateOptions& opts) const {
  if (!messages.is_array()) return invalid_argument("messages must be a JSON array");
  if (!opts.extra_context.is_object()) return invalid_argument("extra_context must be a JSON object");
  if (!opts.tools.is_null() && !opts.tools.is_array()) return invalid_argument("tools must be a JSON array");
  try {
    Value msgs = jinja::from_json(messages);
    if (!renders_content_parts_) msgs = flatten_content_parts(msgs);
    jinja::DictData ctx;
    ctx.set("messages", std::move(msgs));
    ctx.set("tools", jinja::from_json(opts.tools));
    ctx.set("documents", Value::none());
    ctx.set("add_generation_prompt", Value::boolean(opts.add_generation_prompt));
    ctx.set("bos_token", Value::string(opts.bos_token.value_or(default_bos_)));
    ctx.set("eos_token", Value::string(opts.eos_token.value_or(default_eos_)));
    for (auto it = opts.extra_context.begin(); it != opts.extra_context.end(); ++it) {
      ctx.set(it.key(), jinja::from_json(it.value()));
    }
    jinja::RenderOptions ro;
    ro.limits = limits_;
    ro.now = opts.now;
    ro.local_time = opts.local_time;
    return jinja::render(*program_, Value::dict(std::move(ctx)), ro);
  } catch (const jinja::Error& e) {
    return to_status(e, program_->source, false);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("out of memory while rendering the chat template");
  }
}

Expected<std::string> ChatTemplate::render(const nlohmann::json& messages, const ChatTemplateOptions& opts) const {
  return render_json(messages, opts);
}

Expected<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages,
                                           const ChatTemplateOptions& opts) const {
  return render_json(messages, opts);
}

Expected<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                           const ChatTemplateOptions& opts) const {
  return render_json(messages_to_json(messages), opts);
}

}  // namespace metro::tokenizer
