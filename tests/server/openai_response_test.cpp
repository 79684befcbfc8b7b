// Engine events -> OpenAI bodies and SSE chunks; UTF-8 safety of everything written.
#include "server/openai_response.h"

#include <gtest/gtest.h>

#include <cstring>

#include "engine/engine_test_util.h"
#include "server/json_util.h"
#include "server/tool_calls.h"
#include "server/response_store.h"
#include "server/openai_responses.h"
#include "support/test_util.h"

namespace metro::server {
namespace {

using nlohmann::json;

engine::Event delta(int index, std::string text, std::vector<int32_t> ids = {}, int64_t t = 0) {
  engine::Event e;
  e.kind = engine::Event::Kind::kDelta;
  e.index = index;
  e.text = std::move(text);
  for (int32_t id : ids) e.tokens.push_back({id, -0.5f, {{id, -0.5f}, {id + 1, -1.5f}}});
  e.time_ns = t;
  return e;
}
engine::Event finish(int index, engine::FinishReason r, std::string msg = {}) {
  engine::Event e;
  e.kind = engine::Event::Kind::kFinish;
  e.index = index;
  e.reason = r;
  e.message = std::move(msg);
  return e;
}
engine::Event done(int prompt, int completion, int cached = 0) {
  engine::Event e;
  e.kind = engine::Event::Kind::kDone;
  e.usage = {prompt, cached, completion};
  return e;
}

// The JSON payloads of an SSE byte stream; "[DONE]" as a string.
std::vector<json> sse_payloads(const std::string& s) {
  std::vector<json> out;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t end = s.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event";
    if (end == std::string::npos) break;
    const std::string ev = s.substr(pos, end - pos);
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    const std::string data = ev.substr(6);
    out.push_back(data == "[DONE]" ? json("[DONE]") : json::parse(data));
    pos = end + 2;
  }
  return out;
}

class OpenAiResponseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_MODEL();
    tok_ = testing::default_model().tokenizer.get();
    ASSERT_NE(tok_, nullptr);
  }
  const tokenizer::Tokenizer* tok_ = nullptr;
};

TEST(SseTest, EventFraming) {
  EXPECT_EQ(sse_event("{\"a\":1}"), "data: {\"a\":1}\n\n");
  EXPECT_STREQ(kSseDone, "data: [DONE]\n\n");
}

TEST(Base64Test, Rfc4648Vectors) {
  const std::pair<const char*, const char*> cases[] = {{"", ""},
                                                       {"f", "Zg=="},
                                                       {"fo", "Zm8="},
                                                       {"foo", "Zm9v"},
                                                       {"foob", "Zm9vYg=="},
                                                       {"fooba", "Zm9vYmE="},
                                                       {"foobar", "Zm9vYmFy"}};
  for (auto [in, out] : cases) EXPECT_EQ(base64_encode(in, std::strlen(in)), out) << in;
}

TEST(Utf8Test, SanitizeReplacesMaximalSubparts) {
  EXPECT_EQ(sanitize_utf8("plain ascii"), "plain ascii");
  EXPECT_EQ(sanitize_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x9a\x87"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x9a\x87");
  const std::string r = "\xef\xbf\xbd";
  EXPECT_EQ(sanitize_utf8("a\x80z"), "a" + r + "z");
  EXPECT_EQ(sanitize_utf8("\xe2\x82"), r);                      // truncated: one replacement
  EXPECT_EQ(sanitize_utf8("\xc0\x80"), r + r);                  // overlong
  EXPECT_EQ(sanitize_utf8("\xed\xa0\x80"), r + r + r);          // surrogate
  EXPECT_EQ(sanitize_utf8("\xf4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(sanitize_utf8("\xf0\x9f\x9a"), r);
  EXPECT_TRUE(is_valid_utf8(sanitize_utf8("\xff\xfe\xf0\x9f")));
  EXPECT_FALSE(is_valid_utf8("\xf0\x9f"));
}

TEST_F(OpenAiResponseTest, ChatStreamChunks) {
  ResponseSpec spec;
  spec.endpoint = Endpoint::kChatCompletions;
  spec.stream = true;
  spec.include_usage = true;
  spec.model = "smol";
  ResponseFormatter f(spec, *tok_, 1, "chatcmpl-x", 1700000000);
  std::string out;
  f.on_event(0, delta(0, "Hel", {1}, 100), &out);
  f.on_event(0, delta(0, "", {2}, 200), &out);  // held-back bytes: no chunk without logprobs
  f.on_event(0, delta(0, "lo", {3}, 300), &out);
  f.on_event(0, finish(0, engine::FinishReason::kStop), &out);
  EXPECT_FALSE(f.all_done());
  f.on_event(0, done(5, 3, 2), &out);
  ASSERT_TRUE(f.all_done());
  out += f.finish();
  auto ev = sse_payloads(out);
  ASSERT_EQ(ev.size(), 6u) << out;
  EXPECT_EQ(ev[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(ev[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(ev[0]["id"], "chatcmpl-x");
  EXPECT_EQ(ev[0]["created"], 1700000000);
  EXPECT_TRUE(ev[0]["usage"].is_null());
  std::string text;
  for (size_t i = 1; i < 3; ++i) text += ev[i]["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(text, "Hello");
  EXPECT_EQ(ev[3]["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(ev[4]["choices"].empty());
  EXPECT_EQ(ev[4]["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(ev[4]["usage"]["completion_tokens"], 3);
  EXPECT_EQ(ev[4]["usage"]["total_tokens"], 8);
  EXPECT_EQ(ev[4]["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
  EXPECT_EQ(ev[5], "[DONE]");
  EXPECT_EQ(f.first_token_ns(), 100);
  EXPECT_EQ(f.last_token_ns(), 300);
  EXPECT_EQ(f.generated_tokens(), 3);
}

TEST(FingerprintTest, NamesTheTiers) {
  EXPECT_EQ(system_fingerprint(0), "metro");
  EXPECT_EQ(system_fingerprint(1), "metro-high");
  EXPECT_EQ(system_fingerprint(2), "metro-low");
  EXPECT_EQ(system_fingerprint(3), "metro-high+low");
}

TEST_F(OpenAiResponseTest, FingerprintFollowsTheTierOfEachChunkAndOfTheWholeBody) {
  ResponseSpec spec;
  spec.endpoint = Endpoint::kChatCompletions;
  spec.stream = true;
  spec.model = "smol";
  ResponseFormatter f(spec, *tok_, 1, "chatcmpl-x", 1700000000);
  std::string out;
  engine::Event a = delta(0, "Hel", {1}, 100);
  a.tier = 1;
  engine::Event b = delta(0, "lo", {3}, 300);
  b.tier = 0;
  f.on_event(0, a, &out);
  f.on_event(0, b, &out);
  f.on_event(0, finish(0, engine::FinishReason::kStop), &out);
  f.on_event(0, done(5, 2), &out);
  out += f.finish();
  auto ev = sse_payloads(out);
  ASSERT_GE(ev.size(), 3u) << out;
  EXPECT_EQ(ev[1]["system_fingerprint"], "metro-low");
  EXPECT_EQ(ev[2]["system_fingerprint"], "metro-high");

  spec.stream = false;
  ResponseFormatter whole(spec, *tok_, 1, "chatcmpl-y", 1700000000);
  whole.on_event(0, a, &out);
  whole.on_event(0, b, &out);
  whole.on_event(0, finish(0, engine::FinishReason::kStop), &out);
  engine::Event d = done(5, 2);
  d.usage.tiers = 3;
  whole.on_event(0, d, &out);
  EXPECT_EQ(json::parse(whole.finish())["system_fingerprint"], "metro-high+low");
  // One tier: the plain name.
  ResponseFormatter plain(spec, *tok_, 1, "chatcmpl-z", 1700000000);
  plain.on_event(0, delta(0, "Hi", {1}, 100), &out);
  plain.on_event(0, finish(0, engine::FinishReason::kStop), &out);
  plain.on_event(0, done(5, 1), &out);
  EXPECT_EQ(json::parse(plain.finish())["system_fingerprint"], "metro");
}

TEST_F(OpenAiResponseTest, ChatBodyWithLogprobsAndBadUtf8) {
  ResponseSpec spec;
  spec.endpoint = Endpoint::kChatCompletions;
  spec.chat_logprobs = true;
  spec.top_logprobs = 2;
  spec.n = 2;
  spec.model = "smol";
  ResponseFormatter f(spec, *tok_, 1, "chatcmpl-y", 1);
  std::string out;
  f.on_event(0, delta(1, "b\xff", {10}), &out);
  f.on_event(0, delta(0, "a", {11}), &out);
  f.on_event(0, finish(0, engine::FinishReason::kLength), &out);
  f.on_event(0, finish(1, engine::FinishReason::kStop), &out);
  f.on_event(0, done(4, 2), &out);
  EXPECT_TRUE(out.empty());
  const std::string body = f.finish();
  ASSERT_TRUE(is_valid_utf8(body));
  json j = json::parse(body);
  EXPECT_EQ(j["object"], "chat.completion");
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "a");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][1]["message"]["content"], "b\xef\xbf\xbd");
  EXPECT_EQ(j["choices"][1]["finish_reason"], "stop");
  const json& lp = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 1u);
  EXPECT_EQ(lp[0]["token"], sanitize_utf8(tok_->token_to_piece(11)));
  EXPECT_FLOAT_EQ(lp[0]["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(lp[0]["top_logprobs"].size(), 2u);
  EXPECT_TRUE(lp[0]["bytes"].is_array());
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
}

// Teacher capture has the engine compute more alternatives than the client asked for: the
// response shows only what was asked.
TEST_F(OpenAiResponseTest, LogprobsKeepToTheAlternativesAskedFor) {
  for (int asked : {0, 1}) {
    ResponseSpec chat;
    chat.endpoint = Endpoint::kChatCompletions;
    chat.chat_logprobs = true;
    chat.top_logprobs = asked;
    chat.model = "smol";
    ResponseFormatter f(chat, *tok_, 1, "chatcmpl-c", 1);
    std::string out;
    f.on_event(0, delta(0, "a", {11, 12}), &out);
    f.on_event(0, finish(0, engine::FinishReason::kLength), &out);
    f.on_event(0, done(4, 2), &out);
    const json lp = json::parse(f.finish())["choices"][0]["logprobs"]["content"];
    ASSERT_EQ(lp.size(), 2u);
    for (const json& t : lp) EXPECT_EQ(t["top_logprobs"].size(), static_cast<size_t>(asked)) << t;

    ResponseSpec comp;
    comp.endpoint = Endpoint::kCompletions;
    comp.logprobs = asked;
    comp.model = "smol";
    ResponseFormatter g(comp, *tok_, 1, "cmpl-c", 1);
    g.on_event(0, delta(0, "a", {11}), &out);
    g.on_event(0, finish(0, engine::FinishReason::kLength), &out);
    g.on_event(0, done(4, 1), &out);
    const json top = json::parse(g.finish())["choices"][0]["logprobs"]["top_logprobs"][0];
    // The chosen token is always listed (it is also the best alternative here).
    EXPECT_EQ(top.size(), 1u) << top;
  }
  // Nothing asked: no logprobs at all.
  ResponseSpec none;
  none.endpoint = Endpoint::kCompletions;
  none.model = "smol";
  ResponseFormatter h(none, *tok_, 1, "cmpl-d", 1);
  std::string out;
  h.on_event(0, delta(0, "a", {11}), &out);
  h.on_event(0, finish(0, engine::FinishReason::kLength), &out);
  h.on_event(0, done(4, 1), &out);
  EXPECT_TRUE(json::parse(h.finish())["choices"][0]["logprobs"].is_null());
}

// /v1/responses with tools: a stream opens a function_call item per call and sends its
// arguments as written; a call cut short by the length bound ends `incomplete`; the stored
// turn keeps only the complete calls.
TEST_F(OpenAiResponseTest, ResponsesStreamFunctionCallItems) {
  ResponseStore store(1 << 20);
  for (bool stream : {true, false}) {
    ResponseSpec spec;
    spec.endpoint = Endpoint::kResponses;
    spec.stream = stream;
    spec.model = "smol";
    spec.tools = std::make_shared<ToolRequest>();
    auto rc = std::make_shared<ResponsesCall>();
    for (const char* k : {"instructions", "max_output_tokens", "previous_response_id", "user"}) rc->echo[k] = nullptr;
    rc->echo["temperature"] = 1.0;
    rc->echo["top_p"] = 1.0;
    rc->echo["store"] = true;
    rc->echo["metadata"] = nlohmann::ordered_json::object();
    rc->echo["text"] = {{"format", {{"type", "text"}}}};
    rc->echo["tools"] = nlohmann::ordered_json::array();
    rc->echo["tool_choice"] = "auto";
    rc->echo["parallel_tool_calls"] = true;
    rc->conversation = json::array({{{"role", "user"}, {"content", "hi"}}});
    rc->store = &store;
    rc->tenant = "t";
    spec.responses = rc;
    ResponseFormatter f(spec, *tok_, 1, stream ? "resp_s" : "resp_w", 1);
    std::string out;
    for (const char* piece : {"{\"tool_calls\": [{\"name\": \"f\", \"arg", "uments\": {\"a\": ", "1}}, ",
                              "{\"name\": \"g\", \"arguments\": {\"b\""}) {
      f.on_event(0, delta(0, piece, {11}), &out);
    }
    f.on_event(0, finish(0, engine::FinishReason::kLength), &out);
    f.on_event(0, done(3, 4), &out);
    out += f.finish();
    json resp;
    if (stream) {
      std::vector<json> events;
      std::string args_f;
      for (size_t at = 0; (at = out.find("data: ", at)) != std::string::npos;) {
        const size_t end = out.find('\n', at);
        events.push_back(json::parse(out.substr(at + 6, end - at - 6)));
        at = end;
      }
      ASSERT_GE(events.size(), 6u);
      EXPECT_EQ(events[0]["type"], "response.created");
      std::vector<std::string> added;
      for (size_t i = 0; i < events.size(); ++i) {
        EXPECT_EQ(events[i]["sequence_number"], i);
        if (events[i]["type"] == "response.output_item.added") added.push_back(events[i]["item"]["name"]);
        if (events[i]["type"] == "response.function_call_arguments.delta" && events[i]["output_index"] == 0) {
          args_f += events[i]["delta"].get<std::string>();
        }
      }
      EXPECT_EQ(added, (std::vector<std::string>{"f", "g"}));
      EXPECT_EQ(args_f, "{\"a\": 1}");
      EXPECT_EQ(events.back()["type"], "response.incomplete");
      resp = events.back()["response"];
    } else {
      resp = json::parse(out);
    }
    EXPECT_EQ(resp["status"], "incomplete");
    const json& output = resp["output"];
    ASSERT_GE(output.size(), 1u) << resp;
    EXPECT_EQ(output[0]["type"], "function_call");
    EXPECT_EQ(output[0]["name"], "f");
    EXPECT_EQ(output[0]["arguments"], "{\"a\": 1}");
    EXPECT_EQ(output[0]["status"], "completed");
    EXPECT_EQ(output[0]["call_id"].get<std::string>().rfind("call_", 0), 0u);
    if (stream) {
      // The cut call went out in part and is marked so; the whole body drops it.
      ASSERT_EQ(output.size(), 2u) << resp;
      EXPECT_EQ(output[1]["status"], "incomplete");
    } else {
      EXPECT_EQ(output.size(), 1u) << resp;
    }
    auto stored = store.get("t", stream ? "resp_s" : "resp_w");
    ASSERT_NE(stored, nullptr);
    const json& turn = stored->conversation.back();
    EXPECT_EQ(turn["role"], "assistant");
    EXPECT_TRUE(turn["content"].is_null()) << turn;
    ASSERT_EQ(turn["tool_calls"].size(), 1u) << turn;
    EXPECT_EQ(turn["tool_calls"][0]["function"]["name"], "f");
  }
}

TEST_F(OpenAiResponseTest, CompletionChoicesAcrossPromptsAndEcho) {
  ResponseSpec spec;
  spec.endpoint = Endpoint::kCompletions;
  spec.n = 2;
  spec.echo = true;
  spec.echo_text = {"P0 ", "P1 "};
  spec.model = "smol";
  ResponseFormatter f(spec, *tok_, 2, "cmpl-z", 1);
  std::string out;
  for (size_t req = 0; req < 2; ++req) {
    for (int c = 0; c < 2; ++c) {
      f.on_event(req, delta(c, "r" + std::to_string(req) + "c" + std::to_string(c)), &out);
      f.on_event(req, finish(c, engine::FinishReason::kLength), &out);
    }
    f.on_event(req, done(3, 4, 1), &out);
  }
  json j = json::parse(f.finish());
  EXPECT_EQ(j["object"], "text_completion");
  ASSERT_EQ(j["choices"].size(), 4u);
  EXPECT_EQ(j["choices"][0]["text"], "P0 r0c0");
  EXPECT_EQ(j["choices"][3]["text"], "P1 r1c1");
  EXPECT_EQ(j["choices"][3]["index"], 3);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 6);
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
}

TEST_F(OpenAiResponseTest, CompletionStreamWithLogprobs) {
  ResponseSpec spec;
  spec.endpoint = Endpoint::kCompletions;
  spec.stream = true;
  spec.logprobs = 1;
  spec.model = "smol";
  ResponseFormatter f(spec, *tok_, 1, "cmpl-s", 1);
  std::string out;
  f.on_event(0, delta(0, tok_->token_to_piece(20), {20}), &out);
  f.on_event(0, delta(0, tok_->token_to_piece(21), {21}), &out);
  f.on_event(0, finish(0, engine::FinishReason::kStop), &out);
  f.on_event(0, done(1, 2), &out);
  out += f.finish();
  auto ev = sse_payloads(out);
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0]["choices"][0]["logprobs"]["text_offset"][0], 0);
  EXPECT_EQ(ev[1]["choices"][0]["logprobs"]["text_offset"][0], tok_->token_to_piece(20).size());
  EXPECT_EQ(ev[1]["choices"][0]["logprobs"]["tokens"].size(), 1u);
  EXPECT_EQ(ev[2]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(ev[3], "[DONE]");
}

TEST_F(OpenAiResponseTest, AbortBecomesAnError) {
  ResponseSpec spec;
  spec.endpoint = Endpoint::kChatCompletions;
  spec.stream = true;
  ResponseFormatter f(spec, *tok_, 1, "chatcmpl-a", 1);
  std::string out;
  f.on_event(0, delta(0, "x", {1}), &out);
  f.on_event(0, finish(0, engine::FinishReason::kAbort, "the server is shutting down"), &out);
  f.on_event(0, done(1, 1), &out);
  out += f.finish();
  ASSERT_TRUE(f.failure().has_value());
  EXPECT_EQ(f.failure()->status, 503);
  auto ev = sse_payloads(out);
  ASSERT_GE(ev.size(), 3u);
  EXPECT_TRUE(ev[ev.size() - 2].contains("error"));
  EXPECT_EQ(ev.back(), "[DONE]");
}

TEST_F(OpenAiResponseTest, EmbeddingsFloatAndBase64) {
  ResponseSpec spec;
  spec.endpoint = Endpoint::kEmbeddings;
  spec.model = "smol";
  for (bool b64 : {false, true}) {
    spec.base64 = b64;
    ResponseFormatter f(spec, *tok_, 1, "embd-1", 1);
    engine::Event e;
    e.kind = engine::Event::Kind::kEmbedding;
    e.embedding = {0.6f, -0.8f};
    std::string out;
    f.on_event(0, e, &out);
    f.on_event(0, finish(0, engine::FinishReason::kStop), &out);
    f.on_event(0, done(3, 0), &out);
    json j = json::parse(f.finish());
    EXPECT_EQ(j["object"], "list");
    EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
    EXPECT_EQ(j["usage"]["total_tokens"], 3);
    const json& emb = j["data"][0]["embedding"];
    if (b64) {
      const float v[2] = {0.6f, -0.8f};
      EXPECT_EQ(emb, base64_encode(v, sizeof(v)));
    } else {
      ASSERT_EQ(emb.size(), 2u);
      EXPECT_FLOAT_EQ(emb[1].get<float>(), -0.8f);
    }
  }
}

TEST(ResponseIdTest, PrefixesAndUniqueness) {
  const std::string a = make_response_id(Endpoint::kChatCompletions);
  const std::string b = make_response_id(Endpoint::kChatCompletions);
  EXPECT_EQ(a.rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(a.size(), 9u + 24u);
  EXPECT_NE(a, b);
  EXPECT_EQ(make_response_id(Endpoint::kCompletions).rfind("cmpl-", 0), 0u);
}

}  // namespace
}  // namespace metro::server
