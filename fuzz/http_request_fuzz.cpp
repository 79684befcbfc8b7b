// libFuzzer target: any bytes as the body of /v1/completions, /v1/chat/completions,
// /v1/embeddings, /v1/responses and /v1/feedback go through the whole request mapping (JSON, validation, chat template,
// tokenizer) without crashing, and what it accepts the engine accepts too. The same bytes
// as model output must come out of the response writer as valid UTF-8 JSON (chat and
// Responses API shapes, streamed or not).
//
// Needs the default model's vocabulary and chat template: METRO_MODEL, or
// models/SmolLM2-135M-Instruct.Q4_1.gguf under the working directory (`make fuzz` runs from
// the repository root after `make model`).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "base/check.h"
#include "gguf/gguf.h"
#include "gateway/variant_guard.h"
#include "server/feedback.h"
#include "server/json_util.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/openai_responses.h"
#include "server/tool_calls.h"
#include "server/response_store.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace metro;

struct Fixture {
  std::optional<tokenizer::Tokenizer> tok;
  std::optional<tokenizer::ChatTemplate> tmpl;
  server::PromptContext ctx;
  // Holds one stored conversation, "resp_fuzz" of tenant "", for previous_response_id.
  server::ResponseStore store{1 << 20};
};

const Fixture& fixture() {
  static const Fixture* f = [] {
    auto* fx = new Fixture;
    const char* env = std::getenv("METRO_MODEL");
    const std::string path = env ? env : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    auto file = gguf::File::open(path);
    if (!file.ok()) {
      std::fprintf(stderr, "http_request_fuzz: cannot open %s (set METRO_MODEL): %s\n", path.c_str(),
                   file.status().message().c_str());
      std::abort();
    }
    auto tok = tokenizer::Tokenizer::from_gguf(*file);
    auto tmpl = tokenizer::ChatTemplate::from_gguf(*file);
    METRO_CHECK(tok.ok() && tmpl.ok());
    fx->tok.emplace(std::move(*tok));
    fx->tmpl.emplace(std::move(*tmpl));
    fx->ctx.tokenizer = &*fx->tok;
    fx->ctx.chat_template = &*fx->tmpl;
    fx->ctx.model_name = "fuzz";
    fx->ctx.n_ctx = 512;
    fx->ctx.n_embd = 576;
    fx->store.put("", "resp_fuzz", nlohmann::json::array({{{"role", "user"}, {"content", "hi"}}}), "{}");
    fx->ctx.responses = &fx->store;
    return fx;
  }();
  return *f;
}

void check_accepted(const server::PreparedCall& pc, const Fixture& f) {
  const int32_t n_vocab = f.tok->n_vocab();
  METRO_CHECK(!pc.requests.empty());
  for (const engine::Request& r : pc.requests) {
    METRO_CHECK(!r.prompt.empty());
    for (int32_t id : r.prompt) METRO_CHECK(id >= 0 && id < n_vocab);
    if (r.kind == engine::RequestKind::kGenerate) {
      METRO_CHECK(r.stop.max_tokens >= 1);
      METRO_CHECK(static_cast<int64_t>(r.prompt.size()) + r.stop.max_tokens <= f.ctx.n_ctx);
      METRO_CHECK(r.sampling.validate(n_vocab).ok());
      METRO_CHECK(r.n >= 1 && r.n <= f.ctx.limits.max_n);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& f = fixture();
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (auto endpoint : {server::Endpoint::kChatCompletions, server::Endpoint::kCompletions,
                        server::Endpoint::kEmbeddings, server::Endpoint::kResponses}) {
    auto r = server::prepare_request(endpoint, body, f.ctx, {});
    if (r.ok()) {
      check_accepted(*r, f);
    } else {
      METRO_CHECK(r.error().status >= 400 && r.error().status < 500);
      METRO_CHECK(server::is_valid_utf8(r.error().body()));
    }
  }
  // The bytes as model output: never invalid UTF-8 or broken JSON on the way out.
  // Chat, Responses, and both again with tools (the output read as calls as it streams).
  for (int variant = 0; variant < 4; ++variant) {
    const auto endpoint = variant % 2 == 0 ? server::Endpoint::kChatCompletions : server::Endpoint::kResponses;
    server::ResponseSpec spec;
    spec.endpoint = endpoint;
    spec.stream = size % 2 == 0;
    spec.chat_logprobs = true;
    if (variant >= 2) spec.tools = std::make_shared<server::ToolRequest>();
    if (endpoint == server::Endpoint::kResponses) {
      auto rc = std::make_shared<server::ResponsesCall>();
      rc->echo = nlohmann::ordered_json{{"instructions", nullptr}, {"max_output_tokens", nullptr},
                                        {"previous_response_id", nullptr}, {"temperature", 1.0}, {"top_p", 1.0},
                                        {"store", false}, {"metadata", nlohmann::ordered_json::object()},
                                        {"text", {{"format", {{"type", "text"}}}}}, {"user", nullptr},
                                        {"tools", nlohmann::ordered_json::array()}, {"tool_choice", "auto"},
                                        {"parallel_tool_calls", true}};
      spec.responses = std::move(rc);
    }
    server::ResponseFormatter fmt(spec, *f.tok, 1, "fuzz", 0);
    engine::Event e;
    e.kind = engine::Event::Kind::kDelta;
    e.text.assign(body);
    e.tokens.push_back({static_cast<int32_t>(size % static_cast<size_t>(f.tok->n_vocab())), -1.0f, {}});
    std::string out;
    fmt.on_event(0, e, &out);
    engine::Event fin;
    fin.kind = engine::Event::Kind::kFinish;
    fmt.on_event(0, fin, &out);
    engine::Event done;
    done.kind = engine::Event::Kind::kDone;
    fmt.on_event(0, done, &out);
    out += fmt.finish();
    METRO_CHECK(server::is_valid_utf8(out));
  }
  // The bytes as a /v1/feedback body: a 400 or a 404 (nothing is remembered here), never more.
  static gateway::ModelRegistry registry;
  static gateway::VariantGuard guard(registry);
  if (auto j = server::parse_body(body); j.ok()) {
    auto fb = server::feedback_response(*j, "", guard);
    METRO_CHECK(!fb.ok() && (fb.error().status == 400 || fb.error().status == 404));
    METRO_CHECK(server::is_valid_utf8(fb.error().body()));
  }
  return 0;
}
