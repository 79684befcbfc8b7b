#include "server/openai_response.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "server/json_util.h"
#include "server/request_id.h"

namespace metro::server {

namespace {
// An engine abort as the API error: 503 with the engine's code (deadline_missed, ...) or
// "aborted".
ApiError abort_error(const engine::Event& e) {
  return unavailable_error("the request was aborted: " + e.message, e.code.empty() ? "aborted" : e.code);
}
}  // namespace

std::string make_response_id(Endpoint endpoint) {
  return random_id(endpoint == Endpoint::kChatCompletions ? "chatcmpl-"
                   : endpoint == Endpoint::kCompletions   ? "cmpl-"
                   : endpoint == Endpoint::kResponses     ? "resp_"
                                                          : "embd-");
}

std::string sse_event(const std::string& json_text) { return "data: " + json_text + "\n\n"; }

std::string base64_encode(const void* data, size_t n) {
  static constexpr char kTable[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= n; i += 3) {
    const uint32_t v = (uint32_t{p[i]} << 16) | (uint32_t{p[i + 1]} << 8) | p[i + 2];
    out += kTable[v >> 18];
    out += kTable[(v >> 12) & 63];
    out += kTable[(v >> 6) & 63];
    out += kTable[v & 63];
  }
  if (i < n) {
    uint32_t v = uint32_t{p[i]} << 16;
    if (i + 1 < n) v |= uint32_t{p[i + 1]} << 8;
    out += kTable[v >> 18];
    out += kTable[(v >> 12) & 63];
    out += i + 1 < n ? kTable[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

namespace {

using OJson = nlohmann::ordered_json;

OJson bytes_json(const std::string& piece) {
  OJson b = OJson::array();
  for (char c : piece) b.push_back(static_cast<unsigned char>(c));
  return b;
}

}  // namespace

std::string system_fingerprint(uint8_t tiers, const std::string& variant) {
  std::string f = variant.empty() ? "metro" : "metro@" + variant;
  char sep = '-';
  for (int t = 0; t < engine::adaptive::kNumTiers; ++t) {
    if ((tiers & (1u << t)) == 0) continue;
    f += sep;
    f += engine::adaptive::tier_name(static_cast<engine::adaptive::Tier>(t));
    sep = '+';
  }
  return f;
}

ResponseFormatter::ResponseFormatter(ResponseSpec spec, tokenizer::Tokenizer tokenizer, size_t n_requests,
                                     std::string id, int64_t created_unix_s)
    : spec_(std::move(spec)),
      tok_(std::move(tokenizer)),
      n_requests_(n_requests),
      id_(std::move(id)),
      created_(created_unix_s) {
  if (spec_.endpoint == Endpoint::kEmbeddings) {
    embeddings_.resize(n_requests_);
  } else {
    choices_.resize(n_requests_ * static_cast<size_t>(spec_.n));
  }
}

OJson ResponseFormatter::chunk_base() const {
  OJson j = OJson::object();
  j["id"] = id_;
  j["object"] = spec_.endpoint == Endpoint::kChatCompletions ? "chat.completion.chunk" : "text_completion";
  j["created"] = created_;
  j["model"] = spec_.model;
  j["system_fingerprint"] =
      system_fingerprint(last_tier_ >= 0 ? static_cast<uint8_t>(1u << last_tier_) : tiers_seen_, spec_.variant);
  if (spec_.cache_similarity >= 0.0) j["metro"] = cache_mark();
  return j;
}

OJson ResponseFormatter::cache_mark() const {
  OJson m = OJson::object();
  m["cache"] = "semantic";
  m["similarity"] = std::round(spec_.cache_similarity * 1e4) / 1e4;
  return m;
}

OJson ResponseFormatter::usage_json() const {
  OJson u = OJson::object();
  u["prompt_tokens"] = usage_.prompt_tokens;
  if (spec_.endpoint == Endpoint::kEmbeddings) {
    u["total_tokens"] = usage_.prompt_tokens;
    return u;
  }
  u["completion_tokens"] = usage_.completion_tokens;
  u["total_tokens"] = usage_.prompt_tokens + usage_.completion_tokens;
  u["prompt_tokens_details"] = OJson{{"cached_tokens", usage_.cached_prompt_tokens}};
  u["completion_tokens_details"] = OJson{{"reasoning_tokens", 0},
                                         {"accepted_prediction_tokens", usage_.accepted_prediction_tokens},
                                         {"rejected_prediction_tokens", usage_.rejected_prediction_tokens}};
  return u;
}

OJson ResponseFormatter::chat_logprobs(const std::vector<engine::TokenInfo>& tokens) const {
  OJson content = OJson::array();
  for (const engine::TokenInfo& t : tokens) {
    const std::string piece = tok_.token_to_piece(t.id);
    OJson e = OJson::object();
    e["token"] = sanitize_utf8(piece);
    e["logprob"] = t.logprob;
    e["bytes"] = bytes_json(piece);
    OJson top = OJson::array();
    // The engine may have computed more alternatives than asked for (teacher capture).
    const size_t n_top = std::min(t.top.size(), static_cast<size_t>(std::max(0, spec_.top_logprobs)));
    for (size_t k = 0; k < n_top; ++k) {
      const engine::TokenLogprob& a = t.top[k];
      const std::string ap = tok_.token_to_piece(a.id);
      top.push_back(OJson{{"token", sanitize_utf8(ap)}, {"logprob", a.logprob}, {"bytes", bytes_json(ap)}});
    }
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return content;
}

OJson ResponseFormatter::completion_logprobs(const std::vector<engine::TokenInfo>& tokens, size_t* offset) const {
  OJson lp = OJson::object();
  OJson toks = OJson::array(), lps = OJson::array(), tops = OJson::array(), offs = OJson::array();
  for (const engine::TokenInfo& t : tokens) {
    const std::string piece = tok_.token_to_piece(t.id);
    toks.push_back(sanitize_utf8(piece));
    lps.push_back(t.logprob);
    OJson top = OJson::object();
    const size_t n_top = std::min(t.top.size(), static_cast<size_t>(std::max(0, spec_.logprobs)));
    for (size_t k = 0; k < n_top; ++k) top[sanitize_utf8(tok_.token_to_piece(t.top[k].id))] = t.top[k].logprob;
    if (!top.contains(sanitize_utf8(piece))) top[sanitize_utf8(piece)] = t.logprob;
    tops.push_back(std::move(top));
    offs.push_back(*offset);
    *offset += piece.size();
  }
  lp["tokens"] = std::move(toks);
  lp["token_logprobs"] = std::move(lps);
  lp["top_logprobs"] = std::move(tops);
  lp["text_offset"] = std::move(offs);
  return lp;
}

void ResponseFormatter::append_logprobs(ChoiceState& c, const OJson& lp) {
  if (spec_.endpoint == Endpoint::kChatCompletions) {
    if (c.logprobs.is_null()) c.logprobs = OJson{{"content", OJson::array()}};
    for (const auto& e : lp) c.logprobs["content"].push_back(e);
    return;
  }
  if (c.logprobs.is_null())
    c.logprobs = lp;
  else {
    for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
      for (const auto& e : lp[k]) c.logprobs[k].push_back(e);
    }
  }
}

void ResponseFormatter::on_event(size_t req, const engine::Event& e, std::string* out) {
  using Kind = engine::Event::Kind;
  switch (e.kind) {
    case Kind::kDelta:
      on_delta(req * static_cast<size_t>(spec_.n) + static_cast<size_t>(e.index), e, out);
      break;
    case Kind::kFinish:
      if (spec_.endpoint == Endpoint::kEmbeddings) {
        if (e.reason == engine::FinishReason::kAbort || e.reason == engine::FinishReason::kError) {
          if (!failure_) failure_ = abort_error(e);
        }
        break;
      }
      on_finish(req * static_cast<size_t>(spec_.n) + static_cast<size_t>(e.index), e, out);
      break;
    case Kind::kEmbedding:
      if (req < embeddings_.size()) embeddings_[req] = e.embedding;
      break;
    case Kind::kDone:
      ++n_done_;
      usage_.prompt_tokens += e.usage.prompt_tokens;
      usage_.cached_prompt_tokens += e.usage.cached_prompt_tokens;
      usage_.completion_tokens += e.usage.completion_tokens;
      usage_.accepted_prediction_tokens += e.usage.accepted_prediction_tokens;
      usage_.rejected_prediction_tokens += e.usage.rejected_prediction_tokens;
      usage_.tiers = static_cast<uint8_t>(usage_.tiers | e.usage.tiers);
      usage_.queue_ns = std::max(usage_.queue_ns, e.usage.queue_ns);
      break;
  }
}

void ResponseFormatter::on_delta(size_t ci, const engine::Event& e, std::string* out) {
  if (ci >= choices_.size()) return;
  ChoiceState& c = choices_[ci];
  if (e.tier >= 0) {
    last_tier_ = e.tier;
    tiers_seen_ = static_cast<uint8_t>(tiers_seen_ | (1u << e.tier));
  }
  if (!e.tokens.empty()) {
    if (first_token_ns_ == 0) first_token_ns_ = e.time_ns;
    last_token_ns_ = e.time_ns;
    generated_tokens_ += static_cast<int>(e.tokens.size());
  }
  const bool chat = spec_.endpoint == Endpoint::kChatCompletions;
  std::string text = sanitize_utf8(e.text);
  if (spec_.endpoint == Endpoint::kResponses) {
    c.text += text;
    c.started = true;
    if (spec_.stream && spec_.tools) {
      if (!c.tool_stream) c.tool_stream = std::make_unique<ToolCallStream>(spec_.tools->format);
      responses_tool_pieces(c.tool_stream->feed(text), out);
    } else if (spec_.stream) {
      responses_delta(text, out);
    }
    return;
  }
  const bool tool_stream = spec_.stream && parses_tools();
  ToolStreamPieces pieces;
  if (tool_stream) {
    if (!c.tool_stream) c.tool_stream = std::make_unique<ToolCallStream>(spec_.tools->format);
    pieces = c.tool_stream->feed(text);
    text.clear();
  }
  const bool want_lp = chat ? spec_.chat_logprobs : spec_.logprobs >= 0;
  std::string echo;
  if (!c.started && spec_.echo) {
    echo = sanitize_utf8(spec_.echo_text[ci / static_cast<size_t>(spec_.n)]);
    c.text_bytes = echo.size();
  }
  OJson lp;
  if (want_lp && !e.tokens.empty()) {
    lp = chat ? chat_logprobs(e.tokens) : completion_logprobs(e.tokens, &c.text_bytes);
  }
  if (!spec_.stream) {
    if (!c.started) c.text += echo;
    c.text += text;
    if (!lp.is_null()) append_logprobs(c, lp);
    c.started = true;
    return;
  }
  OJson base = chunk_base();
  if (chat && !c.started) {
    OJson role = base;
    role["choices"] = OJson::array({OJson{{"index", ci},
                                          {"delta", OJson{{"role", "assistant"}, {"content", ""}}},
                                          {"logprobs", nullptr},
                                          {"finish_reason", nullptr}}});
    if (spec_.include_usage) role["usage"] = nullptr;
    *out += sse_event(dump_json(role));
  }
  const bool first = !c.started;
  c.started = true;
  if (tool_stream) {
    send_tool_pieces(ci, pieces, std::move(lp), out);
    return;
  }
  if (text.empty() && lp.is_null() && !(first && !echo.empty())) return;
  OJson choice = OJson::object();
  choice["index"] = ci;
  if (chat) {
    choice["delta"] = OJson{{"content", text}};
    choice["logprobs"] = lp.is_null() ? OJson(nullptr) : OJson{{"content", lp}};
  } else {
    choice["text"] = echo + text;
    choice["logprobs"] = lp.is_null() ? OJson(nullptr) : lp;
  }
  choice["finish_reason"] = nullptr;
  base["choices"] = OJson::array({std::move(choice)});
  if (spec_.include_usage) base["usage"] = nullptr;
  *out += sse_event(dump_json(base));
}

void ResponseFormatter::send_tool_pieces(size_t ci, const ToolStreamPieces& pieces, OJson lp, std::string* out) {
  ChoiceState& c = choices_[ci];
  auto chunk = [&](OJson delta, OJson logprobs) {
    OJson base = chunk_base();
    OJson choice = OJson::object();
    choice["index"] = ci;
    choice["delta"] = std::move(delta);
    choice["logprobs"] = std::move(logprobs);
    choice["finish_reason"] = nullptr;
    base["choices"] = OJson::array({std::move(choice)});
    if (spec_.include_usage) base["usage"] = nullptr;
    *out += sse_event(dump_json(base));
  };
  auto content = [&](const std::string& text) {
    chunk(OJson{{"content", sanitize_utf8(text)}}, lp.is_null() ? OJson(nullptr) : OJson{{"content", lp}});
    lp = nullptr;
  };
  // Log-probabilities of tokens that became part of a call ride on an empty content chunk.
  if (!lp.is_null() && (pieces.empty() || pieces.front().kind != ToolStreamPiece::Kind::kContent)) content("");
  for (const ToolStreamPiece& p : pieces) {
    switch (p.kind) {
      case ToolStreamPiece::Kind::kContent:
        content(p.text);
        break;
      case ToolStreamPiece::Kind::kCall: {
        const int index = c.n_calls++;
        chunk(OJson{{"tool_calls", OJson::array({OJson{{"index", index},
                                                        {"id", make_tool_call_id()},
                                                        {"type", "function"},
                                                        {"function", OJson{{"name", sanitize_utf8(p.text)},
                                                                           {"arguments", ""}}}}})}},
              nullptr);
        break;
      }
      case ToolStreamPiece::Kind::kArguments:
        if (c.n_calls == 0) break;
        chunk(OJson{{"tool_calls",
                     OJson::array({OJson{{"index", c.n_calls - 1},
                                         {"function", OJson{{"arguments", sanitize_utf8(p.text)}}}}})}},
              nullptr);
        break;
    }
  }
}

void ResponseFormatter::on_finish(size_t ci, const engine::Event& e, std::string* out) {
  if (ci >= choices_.size()) return;
  ChoiceState& c = choices_[ci];
  if (e.reason == engine::FinishReason::kAbort || e.reason == engine::FinishReason::kError) {
    if (!failure_) {
      if (e.reason == engine::FinishReason::kAbort) {
        failure_ = abort_error(e);
      } else {
        ApiError err;
        err.status = 500;
        err.type = "server_error";
        err.code = "internal_error";
        err.message = "generation failed: " + e.message;
        failure_ = err;
      }
    }
    c.finish_reason = "abort";
    if (spec_.stream && !failure_sent_) {
      failure_sent_ = true;
      if (spec_.endpoint == Endpoint::kResponses) {
        *out += responses_event(nlohmann::ordered_json{
            {"type", "error"}, {"code", failure_->code}, {"message", failure_->message}, {"param", nullptr}});
      } else {
        *out += sse_event(failure_->body());
      }
    }
    return;
  }
  c.finish_reason = engine::finish_reason_name(e.reason);
  if (!spec_.stream || spec_.endpoint == Endpoint::kResponses) return;
  const bool chat = spec_.endpoint == Endpoint::kChatCompletions;
  if (chat && !c.started) {
    engine::Event none;  // a choice that produced no token still announces its role
    on_delta(ci, none, out);
  }
  if (c.tool_stream) {
    // What the stream still held: a last call, or text that did not become one.
    send_tool_pieces(ci, c.tool_stream->finish(), nullptr, out);
  }
  if (c.n_calls > 0 && c.finish_reason == "stop") c.finish_reason = "tool_calls";
  OJson base = chunk_base();
  OJson choice = OJson::object();
  choice["index"] = ci;
  if (chat) {
    choice["delta"] = OJson::object();
  } else {
    choice["text"] = "";
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = c.finish_reason;
  base["choices"] = OJson::array({std::move(choice)});
  if (spec_.include_usage) base["usage"] = nullptr;
  *out += sse_event(dump_json(base));
}

std::vector<std::string> ResponseFormatter::finish_reasons() const {
  std::vector<std::string> out;
  for (const ChoiceState& c : choices_) {
    out.push_back(c.n_calls > 0 && c.finish_reason == "stop" ? "tool_calls" : c.finish_reason);
  }
  return out;
}

std::string ResponseFormatter::finish() {
  if (spec_.endpoint == Endpoint::kResponses) return responses_finish();
  if (!spec_.stream) return finish_body();
  std::string out;
  if (spec_.include_usage && !failure_) {
    OJson base = chunk_base();
    base["choices"] = OJson::array();
    base["usage"] = usage_json();
    out += sse_event(dump_json(base));
  }
  out += kSseDone;
  return out;
}

std::string ResponseFormatter::finish_body() {
  OJson j = OJson::object();
  if (spec_.endpoint == Endpoint::kEmbeddings) {
    j["object"] = "list";
    OJson data = OJson::array();
    for (size_t i = 0; i < embeddings_.size(); ++i) {
      OJson item = OJson::object();
      item["object"] = "embedding";
      item["index"] = i;
      const std::vector<float>& v = embeddings_[i];
      if (spec_.base64) {
        static_assert(std::endian::native == std::endian::little, "base64 embeddings are little-endian float32");
        item["embedding"] = base64_encode(v.data(), v.size() * sizeof(float));
      } else {
        item["embedding"] = v;
      }
      data.push_back(std::move(item));
    }
    j["data"] = std::move(data);
    j["model"] = spec_.model;
    j["usage"] = usage_json();
    return dump_json(j);
  }
  const bool chat = spec_.endpoint == Endpoint::kChatCompletions;
  j["id"] = id_;
  j["object"] = chat ? "chat.completion" : "text_completion";
  j["created"] = created_;
  j["model"] = spec_.model;
  j["system_fingerprint"] = system_fingerprint(static_cast<uint8_t>(tiers_seen_ | usage_.tiers), spec_.variant);
  if (spec_.cache_similarity >= 0.0) j["metro"] = cache_mark();
  OJson choices = OJson::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    ChoiceState& c = choices_[i];
    OJson ch = OJson::object();
    ch["index"] = i;
    if (chat && parses_tools()) {
      ParsedToolOutput po = parse_tool_output(spec_.tools->format, c.text);
      OJson msg = OJson{{"role", "assistant"},
                        {"content", po.calls.empty() || !po.content.empty() ? OJson(sanitize_utf8(po.content))
                                                                            : OJson(nullptr)},
                        {"refusal", nullptr}};
      if (!po.calls.empty()) {
        OJson calls = OJson::array();
        for (const ToolCall& tc : po.calls) {
          calls.push_back(OJson{{"id", make_tool_call_id()},
                                {"type", "function"},
                                {"function", OJson{{"name", sanitize_utf8(tc.name)},
                                                   {"arguments", sanitize_utf8(tc.arguments)}}}});
        }
        msg["tool_calls"] = std::move(calls);
        if (c.finish_reason == "stop") c.finish_reason = "tool_calls";
      }
      ch["message"] = std::move(msg);
      ch["logprobs"] = spec_.chat_logprobs ? (c.logprobs.is_null() ? OJson{{"content", OJson::array()}} : c.logprobs)
                                           : OJson(nullptr);
    } else if (chat) {
      ch["message"] = OJson{{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}};
      ch["logprobs"] = spec_.chat_logprobs ? (c.logprobs.is_null() ? OJson{{"content", OJson::array()}} : c.logprobs)
                                           : OJson(nullptr);
    } else {
      ch["text"] = c.text;
      ch["logprobs"] = spec_.logprobs >= 0 ? c.logprobs : OJson(nullptr);
    }
    ch["finish_reason"] = c.finish_reason.empty() ? OJson(nullptr) : OJson(c.finish_reason);
    choices.push_back(std::move(ch));
  }
  j["choices"] = std::move(choices);
  j["usage"] = usage_json();
  return dump_json(j);
}

}  // namespace metro::server
