#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "loadgen/openai_protocol.h"
#include "loadgen/response_meter.h"
#include "loadgen/url.h"

namespace metro::loadgen {
namespace {

using nlohmann::json;

TEST(LoadgenUrl, ParsesAndRejects) {
  auto u = parse_url("http://127.0.0.1:8080");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 8080);
  EXPECT_EQ(u->path, "");
  auto v = parse_url("http://example.com/proxy/v1/?x=1");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->port, 80);
  EXPECT_EQ(v->path, "/proxy/v1");
  EXPECT_EQ(v->host_header(), "example.com");
  auto six = parse_url("http://[::1]:9000/");
  ASSERT_TRUE(six.ok());
  EXPECT_EQ(six->host, "::1");
  EXPECT_EQ(six->host_header(), "[::1]:9000");
  for (const char* bad : {"localhost:8080", "ftp://x", "http://", "http://h:0", "http://h:70000",
                          "http://h:", "http://u:p@h", "http://[::1"}) {
    EXPECT_FALSE(parse_url(bad).ok()) << bad;
  }
  auto tls = parse_url("https://api.example.com");
  ASSERT_FALSE(tls.ok());
  EXPECT_NE(tls.status().message().find("https"), std::string::npos);
}

TEST(LoadgenProtocol, EndpointPaths) {
  EXPECT_EQ(endpoint_path("", Endpoint::kCompletions), "/v1/completions");
  EXPECT_EQ(endpoint_path("/v1", Endpoint::kChat), "/v1/chat/completions");
  EXPECT_EQ(endpoint_path("/proxy/", Endpoint::kChat), "/proxy/v1/chat/completions");
  EXPECT_EQ(models_path("/v1"), "/v1/models");
}

TEST(LoadgenProtocol, RequestBodies) {
  std::vector<ChatMessage> msgs = {{"system", "sys"}, {"user", "hi"}};
  BodyOptions o;
  o.model = "m";
  json c = json::parse(request_body(o, msgs, 32));
  EXPECT_EQ(c["model"], "m");
  EXPECT_EQ(c["prompt"], "sys\n\nhi");
  EXPECT_EQ(c["max_tokens"], 32);
  EXPECT_EQ(c["stream"], true);
  EXPECT_EQ(c["stream_options"]["include_usage"], true);
  EXPECT_EQ(c["ignore_eos"], true);
  EXPECT_FALSE(c.contains("temperature"));
  o.endpoint = Endpoint::kChat;
  o.stream = false;
  o.ignore_eos = false;
  o.model.clear();
  o.temperature = 0.0;
  json ch = json::parse(request_body(o, msgs, 8));
  EXPECT_FALSE(ch.contains("model"));
  EXPECT_FALSE(ch.contains("prompt"));
  EXPECT_FALSE(ch.contains("stream_options"));
  EXPECT_FALSE(ch.contains("ignore_eos"));
  EXPECT_EQ(ch["temperature"], 0.0);
  ASSERT_EQ(ch["messages"].size(), 2u);
  EXPECT_EQ(ch["messages"][1]["role"], "user");
  EXPECT_EQ(ch["messages"][1]["content"], "hi");
}

TEST(LoadgenProtocol, StreamChunks) {
  auto a = parse_stream_chunk(R"({"choices":[{"text":" the","index":0,"finish_reason":null}]})");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->text, " the");
  EXPECT_TRUE(a->finish_reason.empty());
  auto b = parse_stream_chunk(
      R"({"choices":[{"delta":{"role":"assistant","content":null},"finish_reason":null}]})");
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b->text.empty());  // the role chunk is not a token
  auto c = parse_stream_chunk(
      R"({"choices":[],"usage":{"completion_tokens":3,"prompt_tokens":31,"prompt_tokens_details":{"cached_tokens":20}}})");
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->usage.has_value());
  EXPECT_EQ(c->usage->completion_tokens, 3);
  EXPECT_EQ(c->usage->prompt_tokens, 31);
  EXPECT_EQ(c->usage->cached_tokens, 20);
  auto d = parse_stream_chunk(R"({"choices":[{"delta":{"reasoning_content":"hm"},"finish_reason":"length"}]})");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->text, "hm");
  EXPECT_EQ(d->finish_reason, "length");
  auto e = parse_stream_chunk(R"({"error":{"message":"out of memory"}})");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->error, "out of memory");
  EXPECT_FALSE(parse_stream_chunk("{\"choices\": [").ok());
  EXPECT_FALSE(parse_stream_chunk("[1,2]").ok());
}

TEST(LoadgenProtocol, WholeResponsesAndModels) {
  auto c = parse_completion(
      R"({"choices":[{"message":{"role":"assistant","content":"hi there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":2}})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->text, "hi there");
  EXPECT_EQ(c->finish_reason, "stop");
  EXPECT_EQ(c->usage->completion_tokens, 2);
  EXPECT_FALSE(parse_completion(R"({"error":"nope"})").ok());
  EXPECT_FALSE(parse_completion(R"({"id":"x"})").ok());
  auto m = parse_first_model_id(R"({"data":[{"id":"smol"},{"id":"other"}]})");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, "smol");
  EXPECT_FALSE(parse_first_model_id(R"({"data":[]})").ok());
}

// The meter turns event times into latencies; times here are made up, so exact.
std::string sse(const std::string& payload) { return "data: " + payload + "\n\n"; }
std::string tok(const std::string& t) {
  return sse(R"({"choices":[{"text":")" + t + R"(","finish_reason":null}]})");
}

TEST(LoadgenResponseMeter, StreamLatenciesFromEventTimes) {
  RequestRecord r;
  r.sent_s = 10.0;
  ResponseMeter m(r, /*stream=*/true, /*keep_text=*/true);
  m.on_head(10.05, 200);
  EXPECT_TRUE(m.on_body(10.1, ": comment\n\n"));
  EXPECT_TRUE(m.on_body(10.5, tok("a")));
  EXPECT_TRUE(m.on_body(10.6, tok("b").substr(0, 9)));  // half an event: no token yet
  EXPECT_TRUE(m.on_body(10.7, tok("b").substr(9) + tok("c")));  // two tokens in one read
  EXPECT_TRUE(m.on_body(11.0, tok("d")));
  EXPECT_TRUE(m.on_body(11.1, sse(R"({"choices":[{"text":"","finish_reason":"length"}]})")));
  EXPECT_TRUE(m.on_body(11.1, sse(R"({"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":4}})")));
  EXPECT_TRUE(m.on_body(11.2, "data: [DONE]\n\n"));
  m.on_done(11.5, HttpOutcome{TransportError::kNone, "", 200});
  EXPECT_TRUE(r.ok()) << r.error << " " << r.error_detail;
  EXPECT_DOUBLE_EQ(r.ttft_s, 0.5);
  ASSERT_EQ(r.itl_s.size(), 3u);
  EXPECT_NEAR(r.itl_s[0], 0.2, 1e-12);
  EXPECT_NEAR(r.itl_s[1], 0.0, 1e-12);
  EXPECT_NEAR(r.itl_s[2], 0.3, 1e-12);
  EXPECT_DOUBLE_EQ(r.e2e_s, 1.5);
  EXPECT_NEAR(r.tpot_s, (1.5 - 0.5) / 3.0, 1e-12);
  EXPECT_EQ(r.completion_tokens, 4);
  EXPECT_TRUE(r.usage_reported);
  EXPECT_EQ(r.prompt_tokens, 7);
  EXPECT_EQ(r.n_content_chunks, 4);
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_EQ(r.output_text, "abcd");
}

TEST(LoadgenResponseMeter, CountsChunksWithoutUsage) {
  RequestRecord r;
  ResponseMeter m(r, true, false);
  m.on_head(0, 200);
  m.on_body(1, tok("x") + tok("y") + tok("z") + "data: [DONE]\n\n");
  m.on_done(2, HttpOutcome{TransportError::kNone, "", 200});
  EXPECT_TRUE(r.ok());
  EXPECT_FALSE(r.usage_reported);
  EXPECT_EQ(r.completion_tokens, 3);
  EXPECT_TRUE(r.output_text.empty());
}

TEST(LoadgenResponseMeter, Failures) {
  {  // HTTP error: the status is the key, the body the detail
    RequestRecord r;
    ResponseMeter m(r, true, false);
    m.on_head(0, 429);
    m.on_body(0, R"({"error":{"message":"slow down"}})");
    m.on_done(0.1, HttpOutcome{TransportError::kNone, "", 429});
    EXPECT_EQ(r.error, "429");
    EXPECT_NE(r.error_detail.find("slow down"), std::string::npos);
    EXPECT_TRUE(std::isnan(r.e2e_s));
  }
  {  // the connection breaks mid-stream
    RequestRecord r;
    ResponseMeter m(r, true, false);
    m.on_head(0, 200);
    m.on_body(0.1, tok("x") + "data: {\"cho");
    m.on_done(0.2, HttpOutcome{TransportError::kClosed, "partial message", 200});
    EXPECT_EQ(r.error, "disconnected");
    EXPECT_DOUBLE_EQ(r.ttft_s, 0.1);  // what arrived is still recorded
    EXPECT_TRUE(std::isnan(r.e2e_s));
  }
  {  // a clean end of body without [DONE] or finish_reason is not a complete answer
    RequestRecord r;
    ResponseMeter m(r, true, false);
    m.on_head(0, 200);
    m.on_body(0.1, tok("x"));
    m.on_done(0.2, HttpOutcome{TransportError::kNone, "", 200});
    EXPECT_EQ(r.error, "disconnected");
  }
  {  // [DONE] arrived, then the connection broke: the answer is whole
    RequestRecord r;
    ResponseMeter m(r, true, false);
    m.on_head(0, 200);
    m.on_body(0.1, tok("x") + "data: [DONE]\n\n");
    m.on_done(0.2, HttpOutcome{TransportError::kClosed, "eof", 200});
    EXPECT_TRUE(r.ok()) << r.error;
  }
  {  // garbage instead of JSON chunks stops the read
    RequestRecord r;
    ResponseMeter m(r, true, false);
    m.on_head(0, 200);
    EXPECT_FALSE(m.on_body(0.1, "data: <html>\n\n"));
    m.on_done(0.2, HttpOutcome{TransportError::kAborted, "stopped", 200});
    EXPECT_EQ(r.error, "bad_response");
    EXPECT_NE(r.error_detail.find("not a JSON object"), std::string::npos) << r.error_detail;
  }
  {  // a server error inside the stream
    RequestRecord r;
    ResponseMeter m(r, true, false);
    m.on_head(0, 200);
    EXPECT_FALSE(m.on_body(0.1, sse(R"({"error":{"message":"kv cache full"}})")));
    m.on_done(0.2, HttpOutcome{TransportError::kAborted, "", 200});
    EXPECT_EQ(r.error, "stream_error");
    EXPECT_NE(r.error_detail.find("kv cache full"), std::string::npos);
  }
  {  // timeouts and refused connections
    RequestRecord r;
    ResponseMeter m(r, true, false);
    m.on_done(5, HttpOutcome{TransportError::kTimeout, "late", 0});
    EXPECT_EQ(r.error, "timeout");
    RequestRecord q;
    ResponseMeter n(q, true, false);
    n.on_done(0, HttpOutcome{TransportError::kConnect, "refused", 0});
    EXPECT_EQ(q.error, "connect_error");
  }
}

TEST(LoadgenResponseMeter, WholeResponse) {
  RequestRecord r;
  r.sent_s = 1.0;
  ResponseMeter m(r, /*stream=*/false, /*keep_text=*/true);
  m.on_head(1.5, 200);
  const std::string body =
      R"({"choices":[{"text":"a b c","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":3}})";
  m.on_body(1.6, body.substr(0, 10));
  m.on_body(1.7, body.substr(10));
  m.on_done(2.0, HttpOutcome{TransportError::kNone, "", 200});
  EXPECT_TRUE(r.ok()) << r.error_detail;
  EXPECT_DOUBLE_EQ(r.e2e_s, 1.0);
  EXPECT_TRUE(std::isnan(r.ttft_s));
  EXPECT_TRUE(std::isnan(r.tpot_s));
  EXPECT_EQ(r.completion_tokens, 3);
  EXPECT_EQ(r.output_text, "a b c");
}

}  // namespace
}  // namespace metro::loadgen
