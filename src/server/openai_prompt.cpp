// Prompts of /v1/completions and /v1/embeddings, and prepare_request() for every endpoint.
#include <chrono>
#include <random>

#include "base/clock.h"
#include "grammar/cache.h"
#include "server/json_util.h"
#include "server/openai_request.h"
#include "server/openai_responses.h"
#include "tokenizer/chat_template.h"

namespace metro::server {
namespace detail {

namespace {

std::string context_message(int n_ctx, size_t prompt, int max_tokens) {
  std::string m = "This model's maximum context length is " + std::to_string(n_ctx) +
                  " tokens. However, you requested " + std::to_string(prompt + static_cast<size_t>(max_tokens)) +
                  " tokens (" + std::to_string(prompt) + " in the prompt, " + std::to_string(max_tokens) +
                  " for the completion). Please reduce the prompt or max_tokens.";
  return m;
}

ApiResult<std::vector<int32_t>> token_ids(const nlohmann::json& arr, const std::string& param,
                                          const PromptContext& ctx) {
  const int32_t n_vocab = ctx.tokenizer->n_vocab();
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (const auto& v : arr) {
    // The id as sent (any 64-bit integer; JSON's unsigned ones too) goes into the message.
    std::string as_sent;
    bool inside = false;
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      as_sent = std::to_string(u);
      inside = u < static_cast<uint64_t>(n_vocab);
    } else if (v.is_number_integer()) {
      const int64_t i = v.get<int64_t>();
      as_sent = std::to_string(i);
      inside = i >= 0 && i < n_vocab;
    } else {
      return bad_request(param + " must hold only token ids (integers)", param);
    }
    if (!inside) {
      return bad_request("token id " + as_sent + " in " + param + " is outside the vocabulary [0, " +
                             std::to_string(n_vocab) + ")",
                         param);
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  if (ids.empty()) return bad_request(param + " must not be empty", param);
  return ids;
}

}  // namespace

std::optional<ApiError> check_prompt_bytes(size_t bytes, const PromptContext& ctx, const std::string& param) {
  if (ctx.max_prompt_bytes == 0 || bytes <= ctx.max_prompt_bytes) return std::nullopt;
  return bad_request("the " + param + " is " + std::to_string(bytes) + " bytes: far more than the model's context of " +
                         std::to_string(ctx.n_ctx) + " tokens can hold (at most " +
                         std::to_string(ctx.max_prompt_bytes) + " bytes are tokenized)",
                     param, "context_length_exceeded");
}

ApiResult<std::vector<Prompt>> parse_prompts(const nlohmann::json& value, const char* param, const PromptContext& ctx,
                                             bool parse_special) {
  const tokenizer::Tokenizer& tok = *ctx.tokenizer;
  const std::string p = param;
  std::vector<Prompt> out;
  auto from_text = [&](const std::string& s) -> std::optional<ApiError> {
    if (s.empty()) return bad_request(p + " must not be empty", p);
    if (auto e = check_prompt_bytes(s.size(), ctx, p)) return e;
    Prompt pr;
    pr.tokens = tok.encode(s, /*add_special=*/true, parse_special);
    pr.text = s;
    if (pr.tokens.empty()) return bad_request(p + " must not be empty", p);
    out.push_back(std::move(pr));
    return std::nullopt;
  };
  auto from_ids = [&](const nlohmann::json& arr) -> std::optional<ApiError> {
    auto ids = token_ids(arr, p, ctx);
    if (!ids.ok()) return ids.error();
    Prompt pr;
    pr.tokens = std::move(*ids);
    out.push_back(std::move(pr));
    return std::nullopt;
  };
  const size_t max_prompts = static_cast<size_t>(ctx.limits.max_prompts);
  if (value.is_string()) {
    if (auto e = from_text(value.get_ref<const std::string&>())) return *e;
  } else if (value.is_array()) {
    if (value.empty()) return bad_request(p + " must not be empty", p);
    const auto& first = value.front();
    if (first.is_number()) {
      if (auto e = from_ids(value)) return *e;
    } else if (first.is_string() || first.is_array()) {
      if (value.size() > max_prompts) {
        return bad_request(p + " may hold at most " + std::to_string(max_prompts) + " entries", p);
      }
      for (const auto& item : value) {
        std::optional<ApiError> e;
        if (item.is_string() && first.is_string()) {
          e = from_text(item.get_ref<const std::string&>());
        } else if (item.is_array() && first.is_array()) {
          e = from_ids(item);
        } else {
          e = bad_request(p + " must be a string, an array of strings, an array of token ids or an array of "
                              "arrays of token ids (not a mix)",
                          p);
        }
        if (e) return *e;
      }
    } else {
      return bad_request(p + " must be a string, an array of strings or token ids", p);
    }
  } else {
    return bad_request(p + " must be a string, an array of strings or token ids", p);
  }
  for (Prompt& pr : out) {
    if (pr.text.empty()) pr.text = tok.decode(pr.tokens, tokenizer::DecodeOptions{.render_special = true});
  }
  return out;
}

}  // namespace detail

namespace {

using detail::GenerationFields;
using detail::Prompt;


// Fills requests for generation endpoints from prompts and shared fields; checks context.
std::optional<ApiError> build_generation(std::vector<Prompt>& prompts, const GenerationFields& g,
                                         const PromptContext& ctx, const CallContext& call, bool chat,
                                         PreparedCall* out) {
  const int n_ctx = ctx.n_ctx;
  const size_t choices = prompts.size() * static_cast<size_t>(g.n);
  if (choices > static_cast<size_t>(ctx.limits.max_choices)) {
    return bad_request("prompts x n is " + std::to_string(choices) + "; at most " +
                           std::to_string(ctx.limits.max_choices) + " choices per request",
                       "n");
  }
  for (Prompt& pr : prompts) {
    const size_t np = pr.tokens.size();
    if (np >= static_cast<size_t>(n_ctx)) {
      return bad_request("This model's maximum context length is " + std::to_string(n_ctx) +
                             " tokens. However, your prompt has " + std::to_string(np) +
                             " tokens, which leaves no room for a completion.",
                         chat ? "messages" : "prompt", "context_length_exceeded");
    }
    const int room = n_ctx - static_cast<int>(np);
    int max_tokens;
    if (g.max_tokens) {
      max_tokens = *g.max_tokens;
      if (max_tokens > room) {
        return bad_request(detail::context_message(n_ctx, np, max_tokens), chat ? "messages" : "prompt",
                           "context_length_exceeded");
      }
    } else {
      // OpenAI's defaults: 16 for completions, the rest of the context for chat.
      max_tokens = chat ? room : std::min(16, room);
    }
    engine::Request r;
    r.kind = engine::RequestKind::kGenerate;
    r.prompt = std::move(pr.tokens);
    r.sampling = g.sampling;
    r.stop = g.stop;
    r.stop.max_tokens = max_tokens;
    r.n = g.n;
    r.sla_class = g.sla_class;
    r.deadline_ns = g.deadline_ns;
    r.tenant = call.tenant;
    r.prediction = g.prediction;
    r.speculative = g.speculative;
    r.tier = g.tier;
    r.grammar = g.grammar;
    r.grammar_trigger = g.grammar_trigger;
    out->prompt_tokens += static_cast<int>(r.prompt.size());
    out->requests.push_back(std::move(r));
  }
  return std::nullopt;
}

ApiResult<PreparedCall> prepare_completions(const nlohmann::json& body, const PromptContext& ctx,
                                            const CallContext& call) {
  PreparedCall pc;
  GenerationFields g;
  if (auto e = detail::parse_generation_fields(body, Endpoint::kCompletions, ctx, call, &g)) return *e;
  std::optional<ApiError> err;
  if (auto it = body.find("suffix"); it != body.end() && !it->is_null()) {
    return bad_request("suffix is not supported", "suffix");
  }
  const bool echo = get_bool(body, "echo", &err).value_or(false);
  if (err) return *err;
  const int logprobs = static_cast<int>(get_int(body, "logprobs", 0, ctx.limits.max_logprobs, &err).value_or(-1));
  if (err) return *err;
  if (echo && logprobs >= 0) return bad_request("echo together with logprobs is not supported", "echo");
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return bad_request("prompt is required", "prompt");
  auto prompts = detail::parse_prompts(*it, "prompt", ctx, /*parse_special=*/true);
  if (!prompts.ok()) return prompts.error();
  if (logprobs >= 0) {
    g.sampling.logprobs = true;
    g.sampling.top_logprobs = logprobs;
  }
  pc.spec.endpoint = Endpoint::kCompletions;
  pc.spec.echo = echo;
  pc.spec.logprobs = logprobs;
  if (echo) {
    for (const Prompt& p : *prompts) pc.spec.echo_text.push_back(p.text);
  }
  if (auto e = build_generation(*prompts, g, ctx, call, false, &pc)) return *e;
  pc.spec.stream = g.stream;
  pc.spec.include_usage = g.include_usage;
  pc.spec.n = g.n;
  return pc;
}

ApiResult<PreparedCall> prepare_chat(const nlohmann::json& body, const PromptContext& ctx, const CallContext& call) {
  PreparedCall pc;
  GenerationFields g;
  if (auto e = detail::parse_generation_fields(body, Endpoint::kChatCompletions, ctx, call, &g)) return *e;
  std::optional<ApiError> err;
  const bool logprobs = get_bool(body, "logprobs", &err).value_or(false);
  if (err) return *err;
  const int top = static_cast<int>(get_int(body, "top_logprobs", 0, ctx.limits.max_logprobs, &err).value_or(0));
  if (err) return *err;
  if (top > 0 && !logprobs) return bad_request("top_logprobs needs logprobs set to true", "top_logprobs");
  std::optional<ToolRequest> tools;
  const ToolFormat format =
      ctx.chat_template != nullptr ? detect_tool_format(ctx.chat_template->source()) : ToolFormat::kGeneric;
  if (auto e = parse_tool_request(body, ctx.ordered_body, format, &tools)) return *e;
  if (tools && tools->parses()) {
    if (g.grammar) {
      return bad_request("tools cannot be combined with response_format or metro.choice unless tool_choice is none",
                         "tool_choice");
    }
    if (ctx.grammars == nullptr) return bad_request("tool calling is not available for this model", "tools");
    const ToolRequest& t = *tools;
    auto compiled = ctx.grammars->get(tool_grammar_key(t), [&t] { return tool_call_grammar(t); });
    if (!compiled.ok()) return bad_request(compiled.status().message(), "tools", "unsupported_schema");
    g.grammar = std::move(*compiled);
    if (!t.constrained_from_start()) g.grammar_trigger = std::string(tool_call_trigger(t.format));
    pc.spec.tools = std::make_shared<const ToolRequest>(t);
  }
  auto ids = detail::chat_prompt(body, ctx, tools ? &*tools : nullptr);
  if (!ids.ok()) return ids.error();
  g.sampling.logprobs = logprobs;
  g.sampling.top_logprobs = top;
  std::vector<Prompt> prompts(1);
  prompts[0].tokens = std::move(*ids);
  pc.spec.endpoint = Endpoint::kChatCompletions;
  pc.spec.chat_logprobs = logprobs;
  pc.spec.top_logprobs = top;
  if (auto e = build_generation(prompts, g, ctx, call, true, &pc)) return *e;
  pc.spec.stream = g.stream;
  pc.spec.include_usage = g.include_usage;
  pc.spec.n = g.n;
  return pc;
}

ApiResult<PreparedCall> prepare_embeddings(const nlohmann::json& body, const PromptContext& ctx,
                                           const CallContext& call) {
  PreparedCall pc;
  std::optional<ApiError> err;
  auto fmt = get_string(body, "encoding_format", 16, &err);
  if (err) return *err;
  if (fmt && *fmt != "float" && *fmt != "base64") {
    return bad_request("encoding_format must be float or base64", "encoding_format");
  }
  if (auto d = get_int(body, "dimensions", 1, 1 << 20, &err); d && *d != ctx.n_embd) {
    return bad_request("this model's embeddings have " + std::to_string(ctx.n_embd) + " dimensions", "dimensions");
  }
  if (err) return *err;
  get_string(body, "user", 1024, &err);
  if (err) return *err;
  SlaClass cls = SlaClass::kStandard;
  int64_t deadline_ns = 0;
  if (auto e = detail::parse_traffic_fields(body, call, &cls, &deadline_ns)) return *e;
  auto it = body.find("input");
  if (it == body.end() || it->is_null()) return bad_request("input is required", "input");
  auto prompts = detail::parse_prompts(*it, "input", ctx, /*parse_special=*/false);
  if (!prompts.ok()) return prompts.error();
  for (Prompt& p : *prompts) {
    if (p.tokens.size() > static_cast<size_t>(ctx.n_ctx)) {
      return bad_request("This model's maximum context length is " + std::to_string(ctx.n_ctx) +
                             " tokens. However, an input has " + std::to_string(p.tokens.size()) + " tokens.",
                         "input", "context_length_exceeded");
    }
    engine::Request r;
    r.kind = engine::RequestKind::kEmbed;
    r.prompt = std::move(p.tokens);
    r.sla_class = cls;
    r.deadline_ns = deadline_ns;
    r.tenant = call.tenant;
    pc.prompt_tokens += static_cast<int>(r.prompt.size());
    pc.requests.push_back(std::move(r));
  }
  pc.spec.endpoint = Endpoint::kEmbeddings;
  pc.spec.base64 = fmt && *fmt == "base64";
  return pc;
}

}  // namespace

namespace {

// Deepest [ / { nesting outside strings. Bounded before parsing: nested values reach the
// chat template, whose conversion of JSON is recursive.
int nesting_depth(std::string_view s) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

constexpr int kMaxNesting = 32;

}  // namespace

ApiResult<nlohmann::json> parse_body(std::string_view body) {
  if (body.empty()) return bad_request("the request body is empty; send a JSON object");
  if (nesting_depth(body) > kMaxNesting) {
    return bad_request("the request body nests arrays/objects deeper than " + std::to_string(kMaxNesting));
  }
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return bad_request("the request body is not valid JSON (UTF-8 text; NaN and Infinity are not JSON)");
  }
  if (!j.is_object()) return bad_request("the request body must be a JSON object");
  return j;
}

ApiResult<PreparedCall> prepare_request(Endpoint endpoint, std::string_view body, const PromptContext& ctx,
                                        const CallContext& call) {
  auto j = parse_body(body);
  if (!j.ok()) return j.error();
  if (needs_key_order(endpoint, body)) {
    const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
    PromptContext with_order = ctx;
    with_order.ordered_body = ordered.is_object() ? &ordered : nullptr;
    return prepare_parsed_request(endpoint, *j, with_order, call);
  }
  return prepare_parsed_request(endpoint, *j, ctx, call);
}

bool needs_key_order(Endpoint endpoint, std::string_view body) {
  return endpoint == Endpoint::kResponses || body.find("json_schema") != std::string_view::npos ||
         body.find("\"tools\"") != std::string_view::npos;
}

ApiResult<std::string> requested_model(const nlohmann::json& body) {
  std::optional<ApiError> err;
  auto model = get_string(body, "model", 4096, &err);
  if (err) return *err;
  return model ? *model : std::string();
}

PromptContext prompt_context(const gateway::ServedModel& m, const RequestLimits& limits) {
  PromptContext p;
  p.tokenizer = &m.tokenizer();
  p.chat_template = m.chat_template ? &*m.chat_template : nullptr;
  p.model_name = m.name;
  p.model_aliases = m.aliases;
  p.variant = m.variant;
  p.n_ctx = m.engine->n_ctx();
  p.n_embd = static_cast<int>(m.engine->model().hparams().n_embd);
  p.max_prompt_bytes = 2 * static_cast<size_t>(std::max(1, p.n_ctx)) * m.tokenizer().vocab().max_token_bytes();
  p.limits = limits;
  p.grammars = m.grammars.get();
  return p;
}

ApiResult<PreparedCall> prepare_parsed_request(Endpoint endpoint, const nlohmann::json& j_in, const PromptContext& ctx,
                                        const CallContext& call) {
  const nlohmann::json* j = &j_in;
  if (auto e = detail::check_model(*j, ctx)) return *e;
  ApiResult<PreparedCall> r = [&]() -> ApiResult<PreparedCall> {
    switch (endpoint) {
      case Endpoint::kCompletions:
        return prepare_completions(*j, ctx, call);
      case Endpoint::kChatCompletions:
        return prepare_chat(*j, ctx, call);
      case Endpoint::kEmbeddings:
        return prepare_embeddings(*j, ctx, call);
      case Endpoint::kResponses:
        if (ctx.ordered_body != nullptr) return prepare_responses(*ctx.ordered_body, ctx, call);
        return prepare_responses(nlohmann::ordered_json::parse(j->dump()), ctx, call);
      case Endpoint::kTokenize:
      case Endpoint::kDetokenize:
      case Endpoint::kFeedback:
        break;  // answered without the engine: tokenize_response() / detokenize_response() / feedback
    }
    return bad_request("unknown endpoint");
  }();
  if (r.ok()) {
    r->spec.model = ctx.model_name;
    r->spec.variant = ctx.variant;
  }
  return r;
}

ApiResult<std::string> tokenize_response(const nlohmann::json& body, const PromptContext& ctx) {
  if (auto e = detail::check_model(body, ctx)) return *e;
  std::optional<ApiError> err;
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    auto r = detail::chat_prompt(body, ctx, nullptr);
    if (!r.ok()) return r.error();
    ids = std::move(*r);
  } else {
    const char* key = body.contains("prompt") ? "prompt" : "content";
    auto it = body.find(key);
    if (it == body.end() || !it->is_string()) {
      return bad_request("tokenize takes `prompt` (a string) or chat `messages`", "prompt");
    }
    const std::string& text = it->get_ref<const std::string&>();
    if (auto e = detail::check_prompt_bytes(text.size(), ctx, key)) return *e;
    bool add_special = get_bool(body, "add_special_tokens", &err).value_or(true);
    if (!err && !body.contains("add_special_tokens")) add_special = get_bool(body, "add_special", &err).value_or(true);
    if (err) return *err;
    ids = ctx.tokenizer->encode(text, add_special, /*parse_special=*/true);
  }
  nlohmann::json j = nlohmann::json::object();
  j["tokens"] = ids;
  j["count"] = ids.size();
  j["max_model_len"] = ctx.n_ctx;
  return dump_json(j);
}

ApiResult<std::string> detokenize_response(const nlohmann::json& body, const PromptContext& ctx) {
  if (auto e = detail::check_model(body, ctx)) return *e;
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) return bad_request("detokenize takes `tokens`, an array of token ids", "tokens");
  if (it->size() > 4 * static_cast<size_t>(std::max(1, ctx.n_ctx))) {
    return bad_request("tokens holds more than four contexts of ids", "tokens");
  }
  std::vector<int32_t> ids;
  if (!it->empty()) {
    auto r = detail::token_ids(*it, "tokens", ctx);
    if (!r.ok()) return r.error();
    ids = std::move(*r);
  }
  const std::string text = sanitize_utf8(ctx.tokenizer->decode(ids));
  nlohmann::json j = nlohmann::json::object();
  j["prompt"] = text;
  j["content"] = text;
  return dump_json(j);
}

}  // namespace metro::server
