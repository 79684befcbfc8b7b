// The server in-process over the real model: a completion and a stream end to end through
// the HTTP layer and the gateway's front door (refusals with 429 / 503 + Retry-After; what
// every admitted request holds in the gateway is given back), and several models served by
// name.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>
#include <nlohmann/json.hpp>

#include "base/clock.h"
#include "engine/engine_test_util.h"
#include "server/server.h"
#include "server/server_core.h"
#include "support/test_util.h"

namespace metro::server {
namespace {

using nlohmann::json;

// Sends one request on a fresh connection and reads until the server closes it.
std::string exchange(uint16_t port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 120000) <= 0) break;
    char buf[65536];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

std::string post(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// An in-process server on a free port, no signal handling.
ServerConfig test_config(int threads) {
  ServerConfig cfg;
  cfg.port = 0;
  cfg.handle_signals = false;
  cfg.http_threads = threads;
  cfg.prep_threads = threads;
  return cfg;
}

// Starts `server` and waits until its models are loaded.
void start_serving(Server& server) {
  ASSERT_TRUE(server.start().ok());
  for (int i = 0; i < 6000 && !server.core().loaded(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(server.core().loaded());
}

// A front door that measures nothing at start (the tests set what they need).
std::shared_ptr<gateway::FrontDoor> door_of(gateway::FrontDoorConfig fd = {}) {
  fd.calibrate = false;
  return std::make_shared<gateway::FrontDoor>(fd);
}

// A loader of the default model as `name`, with a small engine (kept in *keep when given).
Server::Loader small_model(std::shared_ptr<engine::Engine>* keep = nullptr, std::string name = "m") {
  return [keep, name](gateway::FrontDoor& door) -> Status {
    const auto& shared = testing::default_model();
    engine::EngineConfig ec;
    ec.n_threads = 1;
    ec.ctx_total = 2048;
    ec.n_ctx = 512;
    METRO_ASSIGN_OR_RETURN(auto eng, engine::Engine::create(shared.model, *shared.tokenizer, ec));
    auto m = std::make_shared<gateway::ServedModel>();
    m->name = name;
    m->engine = std::shared_ptr<engine::Engine>(std::move(eng));
    if (keep) *keep = m->engine;
    return door.add_model(m);
  };
}

// What the gateway holds for requests that are over must be back to nothing.
void expect_settled(gateway::FrontDoor& door, const std::string& tenant = "") {
  EXPECT_EQ(door.inflight_choices(), 0);
  EXPECT_EQ(door.quotas().state(tenant, now_ns()).in_flight, 0);
  for (const auto& m : door.models().all()) {
    if (!m->admission) continue;
    const gateway::QueueState q = m->admission->state();
    for (int c = 0; c < kNumSlaClasses; ++c) {
      EXPECT_EQ(q.requests[static_cast<size_t>(c)], 0) << m->name << " class " << c;
      EXPECT_EQ(q.prompt_tokens[static_cast<size_t>(c)], 0) << m->name << " class " << c;
    }
  }
}

TEST(ServerModelTest, CompletionStreamAndAdmission) {
  REQUIRE_MODEL();
  const auto& shared = testing::default_model();
  ASSERT_TRUE(shared.model);
  ServerConfig cfg = test_config(1);
  gateway::FrontDoorConfig door_cfg;
  door_cfg.max_inflight_choices = 1;  // so that one n=2 request is over the server-wide bound
  // 60 tokens of burst: the first two requests (5 and 6 tokens used) fit; then one asking
  // for 7 + 45 is over what is left (429), and one asking for 7 + 100 could never fit (400).
  door_cfg.default_quota = {.tokens_per_minute = 6, .burst_tokens = 60};
  auto door = door_of(door_cfg);
  cfg.front_door = door;
  Server server(std::move(cfg), small_model());
  start_serving(server);
  if (HasFatalFailure()) return;

  const std::string plain = exchange(server.port(), post("/v1/completions", R"({"prompt":[1,2,3],"max_tokens":2,
      "temperature":0,"ignore_eos":true})"));
  ASSERT_EQ(plain.rfind("HTTP/1.1 200", 0), 0u) << plain;
  json j = json::parse(plain.substr(plain.find("\r\n\r\n") + 4));
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(j["model"], "m");

  const std::string stream = exchange(server.port(), post("/v1/completions", R"({"prompt":[1,2,3],"max_tokens":3,
      "temperature":0,"ignore_eos":true,"stream":true})"));
  ASSERT_EQ(stream.rfind("HTTP/1.1 200", 0), 0u) << stream;
  EXPECT_NE(stream.find("Transfer-Encoding: chunked"), std::string::npos);
  EXPECT_NE(stream.find("data: [DONE]"), std::string::npos);
  EXPECT_NE(stream.find("\"finish_reason\":\"length\""), std::string::npos);
  EXPECT_NE(stream.find("\r\n0\r\n\r\n"), std::string::npos);  // the last chunk

  const std::string never = exchange(server.port(), post("/v1/completions", R"({"prompt":[1,2,3,4,5,6,7],"max_tokens":100})"));
  ASSERT_EQ(never.rfind("HTTP/1.1 400", 0), 0u) << never;
  EXPECT_NE(never.find("\"code\":\"request_exceeds_quota\""), std::string::npos) << never;
  EXPECT_EQ(never.find("Retry-After: "), std::string::npos) << never;
  const std::string refused = exchange(server.port(), post("/v1/completions", R"({"prompt":[1,2,3,4,5,6,7],"max_tokens":45})"));
  ASSERT_EQ(refused.rfind("HTTP/1.1 429", 0), 0u) << refused;
  EXPECT_NE(refused.find("Retry-After: "), std::string::npos);
  EXPECT_NE(refused.find("\"code\":\"tenant_tokens_per_minute\""), std::string::npos);
  EXPECT_NE(refused.find("tokens-per-minute quota"), std::string::npos);
  // The bound on choices over all concurrent requests.
  const std::string over = exchange(server.port(), post("/v1/completions", R"({"prompt":[1,2],"n":2,"max_tokens":2})"));
  ASSERT_EQ(over.rfind("HTTP/1.1 503", 0), 0u) << over;
  EXPECT_NE(over.find("\"code\":\"overloaded\""), std::string::npos);
  EXPECT_NE(over.find("Retry-After:"), std::string::npos);
  // Chat without a chat template is a clear 400, not a crash.
  const std::string chat =
      exchange(server.port(), post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}]})"));
  EXPECT_EQ(chat.rfind("HTTP/1.1 400", 0), 0u) << chat;

  // Every admitted request settled its quota charge, queue place and choices.
  expect_settled(*door);
  // The quota was charged what the two served requests used (3 + 2 and 3 + 3 tokens), not
  // their whole max_tokens, and nothing for the refused ones: refilled at 0.1 token/s since,
  // the bucket is near 60 - 11.
  EXPECT_NEAR(door->quotas().state("", now_ns()).bucket_tokens, 49.0, 3.0);
  const std::string text = door->metrics().render();
  EXPECT_NE(text.find(R"(metro_class_rejections_total{model="m",class="standard",reason="tenant_tokens_per_minute"} 1)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(R"(metro_class_rejections_total{model="m",class="standard",reason="overloaded"} 1)"),
            std::string::npos);
  server.request_drain();
  EXPECT_EQ(server.wait(), 0);
}

// An admitted prompt is held as a pending prefix (credited to requests behind it that share
// it) only until it leaves admission: a request refused after admission and one served
// leave no hold behind, so a later request is credited only with what the cache holds.
TEST(ServerModelTest, AdmissionPendingPrefixesEndWithTheirRequests) {
  REQUIRE_MODEL();
  ServerConfig cfg = test_config(1);
  gateway::FrontDoorConfig door_cfg;
  door_cfg.max_inflight_choices = 1;  // an n=2 request is refused after admission
  auto door = door_of(door_cfg);
  cfg.front_door = door;
  std::shared_ptr<engine::Engine> engine;
  Server server(std::move(cfg), small_model(&engine));
  start_serving(server);
  if (HasFatalFailure()) return;

  std::vector<int32_t> prompt(40);
  for (int i = 0; i < 40; ++i) prompt[static_cast<size_t>(i)] = 100 + i;
  std::string ids;
  for (int32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const std::string over = exchange(server.port(), post("/v1/completions", R"({"prompt":[)" + ids + R"(],"n":2})"));
  ASSERT_EQ(over.rfind("HTTP/1.1 503", 0), 0u) << over;
  // Its hold ended with it, and nothing was computed.
  EXPECT_EQ(engine->cached_prefix_tokens(prompt, true), 0);

  const std::string ok = exchange(server.port(), post("/v1/completions", R"({"prompt":[)" + ids +
                                                                             R"(],"max_tokens":1,"temperature":0})"));
  ASSERT_EQ(ok.rfind("HTTP/1.1 200", 0), 0u) << ok;
  const int block = 16;  // EngineConfig's default KV block
  EXPECT_EQ(engine->cached_prefix_tokens(prompt), 39 / block * block);
  EXPECT_EQ(engine->cached_prefix_tokens(prompt, true), engine->cached_prefix_tokens(prompt));
  // While a request is held pending, the same prompt is credited with it.
  {
    auto hold = engine->hold_pending_prefix(std::vector<int32_t>{7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7});
    EXPECT_EQ(engine->cached_prefix_tokens(std::vector<int32_t>(17, 7), true), block);
  }
  EXPECT_EQ(engine->cached_prefix_tokens(std::vector<int32_t>(17, 7), true), 0);
  // The refused request's hold did not credit the served one: it was queued whole (its
  // place came back when its first token went out).
  expect_settled(*door);
  server.request_drain();
  EXPECT_EQ(server.wait(), 0);
}

// The embeddings batching window end to end: two clients' requests are held until the
// class is full and computed together, each gets its own vectors (the same as without the
// window); a client that leaves while held is taken out of the window, and every held
// request is accounted for (admission done, in-flight counters back to zero).
TEST(ServerModelTest, EmbeddingsBatchingWindow) {
  REQUIRE_MODEL();
  const auto& shared = testing::default_model();
  ASSERT_TRUE(shared.model);
  ServerConfig cfg = test_config(2);
  cfg.drain_timeout_s = 0.5;
  gateway::BatchWindowConfig wc;
  wc.max_batch = {8, 2, 8};  // a standard batch is due when two are held
  wc.wait_fraction = 1.0;
  wc.max_wait_cap_s = 30.0;
  gateway::FrontDoorConfig door_cfg;
  door_cfg.sla.of(SlaClass::kStandard).ttft_s = 60.0;  // a 30 s wait: the size triggers, not the clock
  door_cfg.embed_window = wc;
  auto door = door_of(door_cfg);
  gateway::EmbedBatcher* window = door->embed_window();
  ASSERT_NE(window, nullptr);
  cfg.front_door = door;
  std::shared_ptr<engine::Engine> engine;
  Server server(std::move(cfg), small_model(&engine));
  start_serving(server);
  if (HasFatalFailure()) return;

  // A client that sends one request and leaves while it is held.
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(server.port());
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    const std::string r = post("/v1/embeddings", R"({"input":[9,9,9]})");
    ::send(fd, r.data(), r.size(), MSG_NOSIGNAL);
    for (int i = 0; i < 3000 && window->stats().waiting == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(window->stats().waiting, 1u);
    ::close(fd);
    for (int i = 0; i < 3000 && window->stats().cancelled == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(window->stats().cancelled, 1u);
    EXPECT_EQ(window->stats().waiting, 0u);
  }

  const uint64_t steps_before = engine->stats().steps;
  std::string r1, r2;
  std::thread t1([&] { r1 = exchange(server.port(), post("/v1/embeddings", R"({"input":"The quick brown fox."})")); });
  std::thread t2([&] {
    r2 = exchange(server.port(), post("/v1/embeddings", R"({"input":["Tax law.", "Jazz was born in New Orleans."]})"));
  });
  t1.join();
  t2.join();
  ASSERT_EQ(r1.rfind("HTTP/1.1 200", 0), 0u) << r1;
  ASSERT_EQ(r2.rfind("HTTP/1.1 200", 0), 0u) << r2;
  const json j1 = json::parse(r1.substr(r1.find("\r\n\r\n") + 4));
  const json j2 = json::parse(r2.substr(r2.find("\r\n\r\n") + 4));
  ASSERT_EQ(j1["data"].size(), 1u);
  ASSERT_EQ(j2["data"].size(), 2u);
  // A step's counters are published after its events: wait for them, then a little more in
  // case a second step is still being counted.
  for (int i = 0; i < 500 && engine->stats().steps == steps_before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(engine->stats().steps - steps_before, 1u);  // every input in one step
  const gateway::EmbedBatcherStats ws = window->stats();
  EXPECT_EQ(ws.held, 3u);
  EXPECT_EQ(ws.batches, 1u);
  EXPECT_EQ(ws.submitted, 3u);

  // The same vectors as the engine computes for each input alone.
  auto alone = [&](const std::string& text) {
    engine::Request r;
    r.kind = engine::RequestKind::kEmbed;
    r.prompt = shared.tokenizer->encode(text, true, false);
    return testing::collect(*engine->submit(r)).embedding;
  };
  auto near = [](const json& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t d = 0; d < want.size(); ++d) ASSERT_NEAR(got[d].get<double>(), want[d], 1e-4) << d;
  };
  near(j1["data"][0]["embedding"], alone("The quick brown fox."));
  near(j2["data"][0]["embedding"], alone("Tax law."));
  near(j2["data"][1]["embedding"], alone("Jazz was born in New Orleans."));

  const std::string metrics = exchange(server.port(), "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_NE(metrics.find("metro_embed_window_batches_total 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("metro_embed_window_cancelled_total 1"), std::string::npos);
  EXPECT_NE(metrics.find("metro_embed_window_max_wait_seconds{class=\"standard\"} 30"), std::string::npos);

  expect_settled(*door);
  EXPECT_EQ(server.core().metrics().inflight_requests.load(), 0);

  // A drain that times out while a call is held: the window hands it to the stopped engine
  // and the client gets a 503, not a hang.
  std::string late;
  std::thread t3([&] { late = exchange(server.port(), post("/v1/embeddings", R"({"input":"held at shutdown"})")); });
  for (int i = 0; i < 3000 && window->stats().waiting == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(window->stats().waiting, 1u);
  server.request_drain();
  EXPECT_EQ(server.wait(), 0);
  t3.join();
  EXPECT_EQ(late.rfind("HTTP/1.1 503", 0), 0u) << late;
  expect_settled(*door);
  EXPECT_EQ(server.core().metrics().inflight_requests.load(), 0);
}

}  // namespace
}  // namespace metro::server
