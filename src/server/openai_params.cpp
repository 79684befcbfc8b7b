// Sampling, stop and streaming fields shared by /v1/completions and /v1/chat/completions.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>

#include "base/clock.h"
#include "grammar/lark.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

#include "server/json_util.h"
#include "server/openai_request.h"

namespace metro::server {

const char* endpoint_path(Endpoint e) {
  switch (e) {
    case Endpoint::kCompletions:
      return "/v1/completions";
    case Endpoint::kChatCompletions:
      return "/v1/chat/completions";
    case Endpoint::kEmbeddings:
      return "/v1/embeddings";
    case Endpoint::kTokenize:
      return "/tokenize";
    case Endpoint::kDetokenize:
      return "/detokenize";
    case Endpoint::kResponses:
      return "/v1/responses";
    case Endpoint::kFeedback:
      return "/v1/feedback";
  }
  return "?";
}

namespace detail {

namespace {

constexpr size_t kMaxUserBytes = 1024;

// Echoed client text is cut short and made valid UTF-8 so an error body stays small.
std::string quote_short(const std::string& s) {
  constexpr size_t kMax = 64;
  return "'" + sanitize_utf8(s.size() > kMax ? s.substr(0, kMax) + "..." : s) + "'";
}

std::optional<ApiError> parse_stop(const nlohmann::json& body, const RequestLimits& lim,
                                   std::vector<std::string>* out) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return std::nullopt;
  std::vector<const nlohmann::json*> items;
  if (it->is_string()) {
    items.push_back(&*it);
  } else if (it->is_array()) {
    if (it->size() > static_cast<size_t>(lim.max_stop)) {
      return bad_request("stop may hold at most " + std::to_string(lim.max_stop) + " strings", "stop");
    }
    for (const auto& s : *it) items.push_back(&s);
  } else {
    return bad_request("stop must be a string or an array of strings", "stop");
  }
  for (const nlohmann::json* s : items) {
    if (!s->is_string()) return bad_request("stop must be a string or an array of strings", "stop");
    const auto& str = s->get_ref<const std::string&>();
    if (str.empty()) return bad_request("stop strings must not be empty", "stop");
    if (str.size() > lim.max_stop_bytes) {
      return bad_request("stop strings may be at most " + std::to_string(lim.max_stop_bytes) + " bytes", "stop");
    }
    out->push_back(str);
  }
  return std::nullopt;
}

std::optional<ApiError> parse_logit_bias(const nlohmann::json& body, const PromptContext& ctx,
                                         engine::SamplingParams* sp) {
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return bad_request("logit_bias must be an object {token id: bias}", "logit_bias");
  if (it->size() > static_cast<size_t>(ctx.limits.max_logit_bias)) {
    return bad_request("logit_bias may hold at most " + std::to_string(ctx.limits.max_logit_bias) + " entries",
                       "logit_bias");
  }
  const int32_t n_vocab = ctx.tokenizer->n_vocab();
  for (const auto& [key, value] : it->items()) {
    int64_t id = -1;
    bool digits = !key.empty() && key.size() <= 10;
    for (char c : key) digits = digits && c >= '0' && c <= '9';
    if (digits) id = std::stoll(key);
    if (!digits || id >= n_vocab) {
      return bad_request(
          "logit_bias keys must be token ids in [0, " + std::to_string(n_vocab) + "), got " + quote_short(key),
          "logit_bias");
    }
    if (!value.is_number()) return bad_request("logit_bias values must be numbers", "logit_bias");
    const double b = value.get<double>();
    if (!(b >= -100.0 && b <= 100.0)) {
      return bad_request("logit_bias values must be in [-100, 100], got " + format_number(b), "logit_bias");
    }
    sp->logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
  }
  return std::nullopt;
}

}  // namespace

ApiError unknown_model_error(const std::string& name, const std::vector<std::string>& served) {
  std::string list;
  for (const std::string& m : served) list += (list.empty() ? "" : ", ") + quote_short(m);
  return not_found_error("The model " + quote_short(name) + " does not exist; this server serves " + list, "model",
                         "model_not_found");
}

std::optional<ApiError> check_model(const nlohmann::json& body, const PromptContext& ctx) {
  std::optional<ApiError> err;
  auto model = get_string(body, "model", 4096, &err);
  if (err) return err;
  if (model && *model != ctx.model_name &&
      std::find(ctx.model_aliases.begin(), ctx.model_aliases.end(), *model) == ctx.model_aliases.end()) {
    return not_found_error(
        "The model " + quote_short(*model) + " does not exist; this server serves " + quote_short(ctx.model_name),
        "model", "model_not_found");
  }
  return std::nullopt;
}

// `prediction` and `metro.speculative`: what speculative decoding may draft from; and
// `metro.tier`, the precision tier the request is pinned to.
static std::optional<ApiError> parse_prediction(const nlohmann::json& body, const PromptContext& ctx, GenerationFields* out) {
  std::optional<ApiError> err;
  if (auto it = body.find("metro"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return bad_request("metro must be an object", "metro");
    if (auto v = get_bool(*it, "speculative", &err)) out->speculative = *v;
    if (err) {
      err->param = "metro.speculative";
      return err;
    }
    if (auto t = it->find("tier"); t != it->end() && !t->is_null()) {
      engine::adaptive::Tier tier;
      if (!t->is_string() || !engine::adaptive::parse_tier(t->get<std::string>(), &tier)) {
        return bad_request("metro.tier must be \"high\" or \"low\"", "metro.tier");
      }
      out->tier = tier;
    }
  }
  auto it = body.find("prediction");
  if (it == body.end() || it->is_null()) return std::nullopt;
  const char* shape = "prediction must be {\"type\": \"content\", \"content\": a string or text parts}";
  if (!it->is_object() || !it->contains("type") || (*it)["type"] != "content" || !it->contains("content")) {
    return bad_request(shape, "prediction");
  }
  const nlohmann::json& content = (*it)["content"];
  std::string text;
  if (content.is_string()) {
    text = content.get<std::string>();
  } else if (content.is_array()) {
    for (const nlohmann::json& part : content) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) {
        return bad_request(shape, "prediction.content");
      }
      text += part["text"].get<std::string>();
    }
  } else {
    return bad_request(shape, "prediction.content");
  }
  if (ctx.max_prompt_bytes > 0 && text.size() > ctx.max_prompt_bytes) {
    return bad_request("prediction is longer than the context can hold", "prediction.content",
                       "context_length_exceeded");
  }
  if (text.empty() || ctx.tokenizer == nullptr) return std::nullopt;
  out->prediction = ctx.tokenizer->encode(text, /*add_special=*/false, /*parse_special=*/false);
  if (ctx.n_ctx > 0 && out->prediction.size() > static_cast<size_t>(ctx.n_ctx)) {
    out->prediction.resize(static_cast<size_t>(ctx.n_ctx));
  }
  return std::nullopt;
}

// `response_format` (text, json_object, json_schema) and `metro.choice`: the grammar the
// output must follow, compiled here on the prep thread (or found in the model's cache).
static std::optional<ApiError> parse_output_constraint(const nlohmann::json& body, const PromptContext& ctx,
                                                      GenerationFields* out) {
  std::string key;
  std::function<Expected<grammar::Grammar>()> make;
  std::string param = "response_format";
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    const char* shape =
        "response_format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": \"json_schema\", "
        "\"json_schema\": {\"name\": ..., \"schema\": {...}}}";
    if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string()) return bad_request(shape, param);
    const std::string type = (*it)["type"].get<std::string>();
    if (type == "json_object") {
      key = "json_object";
      make = [] { return Expected<grammar::Grammar>(grammar::json_object_grammar()); };
    } else if (type == "json_schema") {
      auto js = it->find("json_schema");
      if (js == it->end() || !js->is_object()) return bad_request(shape, "response_format.json_schema");
      if (auto n = js->find("name"); n != js->end() && !n->is_null() &&
                                     (!n->is_string() || n->get<std::string>().size() > 64)) {
        return bad_request("response_format.json_schema.name must be a string of at most 64 characters",
                           "response_format.json_schema.name");
      }
      if (auto s = js->find("strict"); s != js->end() && !s->is_null() && !s->is_boolean()) {
        return bad_request("response_format.json_schema.strict must be a boolean", "response_format.json_schema.strict");
      }
      auto schema = js->find("schema");
      if (schema == js->end() || !(schema->is_object() || schema->is_boolean())) {
        return bad_request("response_format.json_schema.schema must be a JSON schema (an object)",
                           "response_format.json_schema.schema");
      }
      param = "response_format.json_schema.schema";
      // The schema as sent, key order kept (properties are generated in that order); a
      // caller without the ordered body gets the keys sorted.
      const nlohmann::ordered_json* sent = nullptr;
      if (ctx.ordered_body != nullptr) {
        const auto& ob = *ctx.ordered_body;
        if (auto rf = ob.find("response_format"); rf != ob.end() && rf->is_object()) {
          if (auto oj = rf->find("json_schema"); oj != rf->end() && oj->is_object() && oj->contains("schema")) {
            sent = &(*oj)["schema"];
          }
        }
      }
      nlohmann::ordered_json s = sent != nullptr ? *sent : nlohmann::ordered_json::parse(schema->dump());
      key = "json_schema:" + s.dump();
      make = [s] { return grammar::json_schema_grammar(s); };
    } else if (type != "text") {
      return bad_request(shape, "response_format.type");
    }
  }
  if (auto m = body.find("metro"); m != body.end() && m->is_object()) {
    if (auto c = m->find("choice"); c != m->end() && !c->is_null()) {
      if (!key.empty()) return bad_request("metro.choice and response_format cannot be combined", "metro.choice");
      if (!c->is_array() || c->empty() || c->size() > 4096) {
        return bad_request("metro.choice must be an array of 1 to 4096 non-empty strings", "metro.choice");
      }
      std::vector<std::string> choices;
      for (const nlohmann::json& x : *c) {
        if (!x.is_string() || x.get<std::string>().empty()) {
          return bad_request("metro.choice must be an array of 1 to 4096 non-empty strings", "metro.choice");
        }
        choices.push_back(x.get<std::string>());
      }
      param = "metro.choice";
      key = "choice:" + c->dump();
      make = [choices] { return grammar::choice_grammar(choices); };
    }
    // Constraints given as text: one at most, and not beside the others.
    struct TextConstraint {
      const char* field;
      const char* what;
      const char* prefix;  // of the cache key
      Expected<grammar::Grammar> (*compile)(std::string_view);
    };
    static constexpr TextConstraint kText[] = {
        {"grammar", "a non-empty GBNF or Lark grammar", "grammar:", &grammar::text_grammar},
        {"regex", "a non-empty regular expression", "regex:", &grammar::regex_grammar}};
    for (const TextConstraint& tc : kText) {
      auto v = m->find(tc.field);
      if (v == m->end() || v->is_null()) continue;
      const std::string field = std::string("metro.") + tc.field;
      if (!key.empty()) {
        return bad_request(field + " cannot be combined with response_format, metro.choice, metro.grammar or metro.regex",
                           field);
      }
      if (!v->is_string() || v->get<std::string>().empty()) return bad_request(field + " must be " + tc.what, field);
      const std::string text = v->get<std::string>();
      param = field;
      key = tc.prefix + text;
      make = [text, compile = tc.compile] { return compile(text); };
    }
  }
  if (key.empty()) return std::nullopt;
  if (ctx.grammars == nullptr) return bad_request("structured outputs are not available for this model", param);
  auto g = ctx.grammars->get(key, make);
  if (!g.ok()) {
    const char* code = param == "metro.regex"     ? "unsupported_regex"
                       : param == "metro.grammar" ? "unsupported_grammar"
                                                  : "unsupported_schema";
    return bad_request(g.status().message(), param, code);
  }
  out->grammar = std::move(*g);
  return std::nullopt;
}

std::optional<ApiError> parse_generation_fields(const nlohmann::json& body, Endpoint endpoint, const PromptContext& ctx,
                                                const CallContext& call, GenerationFields* out) {
  std::optional<ApiError> err;
  const RequestLimits& lim = ctx.limits;
  engine::SamplingParams& sp = out->sampling;
  const int64_t ctx_max = std::max(1, ctx.n_ctx);

  if (auto v = get_int(body, "n", 1, lim.max_n, &err)) out->n = static_cast<int>(*v);
  if (err) return err;
  if (auto v = get_int(body, "best_of", 1, lim.max_n, &err)) {
    if (*v != 1 && *v != out->n) return bad_request("best_of other than n is not supported", "best_of");
  }
  if (err) return err;
  if (auto v = get_int(body, "max_tokens", 1, ctx_max, &err)) out->max_tokens = static_cast<int>(*v);
  if (err) return err;
  if (endpoint == Endpoint::kChatCompletions) {
    if (auto v = get_int(body, "max_completion_tokens", 1, ctx_max, &err)) out->max_tokens = static_cast<int>(*v);
    if (err) return err;
  }
  if (auto v = get_number(body, "temperature", 0.0, 2.0, &err)) sp.temperature = static_cast<float>(*v);
  if (err) return err;
  if (auto v = get_number(body, "top_p", 0.0, 1.0, &err)) {
    if (!(*v > 0.0)) return bad_request("top_p must be in (0, 1], got " + format_number(*v), "top_p");
    sp.top_p = static_cast<float>(*v);
  }
  if (err) return err;
  if (auto v = get_int(body, "top_k", -1, 1 << 20, &err)) sp.top_k = *v < 0 ? 0 : static_cast<int>(*v);
  if (err) return err;
  if (auto v = get_number(body, "min_p", 0.0, 1.0, &err)) sp.min_p = static_cast<float>(*v);
  if (err) return err;
  if (auto v = get_number(body, "presence_penalty", -2.0, 2.0, &err)) sp.presence_penalty = static_cast<float>(*v);
  if (err) return err;
  if (auto v = get_number(body, "frequency_penalty", -2.0, 2.0, &err)) sp.frequency_penalty = static_cast<float>(*v);
  if (err) return err;
  if (auto v = get_number(body, "repetition_penalty", 0.01, 10.0, &err)) {
    sp.repetition_penalty = static_cast<float>(*v);
  }
  if (err) return err;
  if (auto it = body.find("seed"); it != body.end() && !it->is_null()) {
    if (it->is_number_unsigned()) {
      sp.seed = it->get<uint64_t>();
    } else if (it->is_number_integer()) {
      sp.seed = static_cast<uint64_t>(it->get<int64_t>());
    } else {
      return bad_request("seed must be an integer", "seed");
    }
    sp.has_seed = true;
  }
  if (auto e = parse_logit_bias(body, ctx, &sp)) return e;
  if (auto e = parse_stop(body, lim, &out->stop.stop)) return e;
  if (auto v = get_bool(body, "ignore_eos", &err)) out->stop.ignore_eos = *v;
  if (err) return err;
  get_string(body, "user", kMaxUserBytes, &err);
  if (err) return err;
  if (auto v = get_bool(body, "stream", &err)) out->stream = *v;
  if (err) return err;
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return bad_request("stream_options must be an object", "stream_options");
    if (auto v = get_bool(*it, "include_usage", &err)) out->include_usage = *v;
    if (err) {
      err->param = "stream_options.include_usage";
      return err;
    }
  }
  if (auto e = parse_prediction(body, ctx, out)) return e;
  if (auto e = parse_output_constraint(body, ctx, out)) return e;

  return parse_traffic_fields(body, call, &out->sla_class, &out->deadline_ns);
}

std::optional<ApiError> parse_traffic_fields(const nlohmann::json& body, const CallContext& call,
                                             SlaClass* cls, int64_t* deadline_ns) {
  std::optional<ApiError> err;
  // SLA class: the header wins over the body field, which wins over the key's default. The
  // key's class is also a ceiling: a batch key asking for realtime would take the seats and
  // step time its operator gave to others, so that is refused, not lowered in silence.
  *cls = call.default_class.value_or(SlaClass::kStandard);
  std::optional<std::string> name = call.class_header;
  if (auto v = get_string(body, "metro_class", 64, &err); v && !name) name = v;
  if (err) return err;
  if (name && !parse_sla_class(*name, cls)) {
    return bad_request("metro_class (X-Metro-Class) must be realtime, standard or batch", "metro_class");
  }
  if (call.default_class && static_cast<int>(*cls) < static_cast<int>(*call.default_class)) {
    return forbidden_error(std::string("this API key may use class ") + sla_class_name(*call.default_class) +
                               " or lower, not " + sla_class_name(*cls),
                           "metro_class", "class_not_allowed");
  }
  constexpr double kMaxDeadlineMs = 86400.0 * 1000.0;
  std::optional<double> ms;
  if (call.deadline_header) {
    const std::string& h = *call.deadline_header;
    char* end = nullptr;
    const double v = h.empty() ? std::nan("") : std::strtod(h.c_str(), &end);
    if (end == nullptr || *end != '\0' || !(v > 0.0 && v <= kMaxDeadlineMs)) {
      return bad_request("X-Metro-Deadline-Ms must be a number of milliseconds in (0, 86400000]",
                         "metro_deadline_ms");
    }
    ms = v;
  } else {
    ms = get_number(body, "metro_deadline_ms", 1e-3, kMaxDeadlineMs, &err);
    if (err) return err;
  }
  *deadline_ns = ms ? now_ns() + static_cast<int64_t>(*ms * 1e6) : 0;
  return std::nullopt;
}

}  // namespace detail
}  // namespace metro::server
