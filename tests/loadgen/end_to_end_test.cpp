// The load generator against the in-process fake server: real sockets on loopback.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cmath>
#include <cstdlib>
#include <set>

#include "loadgen/fake_openai_server.h"
#include "loadgen/runner.h"
#include "loadgen/stats.h"

namespace metro::loadgen {
namespace {

using testing::FakeBehavior;
using testing::FakeOpenAiServer;
using testing::FakeRequest;

Workload synthetic(size_t n, int64_t max_tokens, const std::string& cls = "default") {
  Workload w;
  w.kind = "test";
  for (size_t i = 0; i < n; ++i) {
    Session s;
    s.class_name = cls;
    Turn t;
    t.user = "request number " + std::to_string(i);
    t.input_words = 3;
    t.max_tokens = max_tokens;
    s.turns.push_back(t);
    w.sessions.push_back(s);
  }
  return w;
}

RunOptions options_for(const FakeOpenAiServer& server) {
  RunOptions o;
  o.url = *parse_url(server.url());
  o.timeout_s = 20;
  o.body.model = "fake-model";
  return o;
}

RunResult run_ok(const Workload& w, const RunOptions& o) {
  auto r = run_workload(w, o);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(*r) : RunResult{};
}

TEST(LoadgenEndToEnd, StreamsCutAtAwkwardPlacesAreMeasured) {
  FakeOpenAiServer server([](const FakeRequest&) {
    FakeBehavior b;
    b.first_token_delay_s = 0.03;
    b.token_interval_s = 0.005;
    return b;
  });
  for (Endpoint ep : {Endpoint::kCompletions, Endpoint::kChat}) {
    Workload w = synthetic(8, 5, "realtime");
    RunOptions o = options_for(server);
    o.body.endpoint = ep;
    o.max_concurrency = 4;
    o.api_key = "sk-test";
    RunResult r = run_ok(w, o);
    ASSERT_EQ(r.requests.size(), 8u);
    for (const auto& rec : r.requests) {
      ASSERT_TRUE(rec.ok()) << rec.error << ": " << rec.error_detail;
      EXPECT_EQ(rec.http_status, 200);
      EXPECT_EQ(rec.completion_tokens, 5);
      EXPECT_TRUE(rec.usage_reported);
      EXPECT_EQ(rec.n_content_chunks, 5);
      EXPECT_EQ(rec.prompt_tokens, 3);
      EXPECT_EQ(rec.cached_tokens, 1);  // the fake says half its prompt was cached
      EXPECT_EQ(rec.finish_reason, "length");
      EXPECT_GE(rec.ttft_s, 0.03);  // the server waited that long before the first token
      EXPECT_EQ(rec.itl_s.size(), 4u);
      EXPECT_GE(rec.e2e_s, rec.ttft_s);
      EXPECT_GE(rec.tpot_s, 0.0);
      EXPECT_GE(rec.sent_s, rec.scheduled_s);
    }
    EXPECT_EQ(r.peak_in_flight, 4u);
    RunSummary s = summarize(r, SloSet());
    EXPECT_EQ(s.overall.n_ok, 8u);
    EXPECT_EQ(s.overall.completion_tokens, 40);
    EXPECT_GT(s.overall.output_token_throughput, 0.0);
  }
  EXPECT_LE(server.peak_concurrent_requests(), 4u);
  auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 16u);
  for (const auto& q : reqs) {
    EXPECT_EQ(q.header("x-metro-class"), "realtime");
    EXPECT_EQ(q.header("authorization"), "Bearer sk-test");
    EXPECT_EQ(q.json["max_tokens"], 5);
    EXPECT_EQ(q.json["ignore_eos"], true);
    EXPECT_EQ(q.json["stream"], true);
    EXPECT_EQ(q.json["stream_options"]["include_usage"], true);
    EXPECT_EQ(q.json["model"], "fake-model");
  }
  EXPECT_EQ(reqs[0].target, "/v1/completions");
  EXPECT_EQ(reqs[15].target, "/v1/chat/completions");
}

TEST(LoadgenEndToEnd, StreamVariantsLineEndingsFramingAndNoUsage) {
  struct Variant {
    bool crlf, chunked, usage;
  };
  for (Variant v : {Variant{true, true, true}, Variant{false, false, true}, Variant{false, true, false}}) {
    FakeOpenAiServer server([v](const FakeRequest&) {
      FakeBehavior b;
      b.crlf = v.crlf;
      b.chunked = v.chunked;
      b.send_usage = v.usage;
      return b;
    });
    RunResult r = run_ok(synthetic(3, 4), options_for(server));
    for (const auto& rec : r.requests) {
      ASSERT_TRUE(rec.ok()) << rec.error << ": " << rec.error_detail;
      EXPECT_EQ(rec.completion_tokens, 4);
      EXPECT_EQ(rec.usage_reported, v.usage);
    }
  }
}

TEST(LoadgenEndToEnd, ErrorsAndMidStreamDisconnectAreCountedByStatus) {
  // The fake decides by max_tokens, so the outcome of each request is known in advance.
  FakeOpenAiServer server([](const FakeRequest& q) {
    FakeBehavior b;
    b.token_interval_s = 0.002;
    const int mt = q.json.value("max_tokens", 0);
    if (mt == 3) b.status = 429;
    if (mt == 4) b.status = 503;
    if (mt == 5) b.status = 500;
    if (mt == 6) b.disconnect_after_tokens = 2;
    if (mt == 7) b.keep_alive = false;
    return b;
  });
  Workload w;
  const int64_t plan[] = {3, 3, 4, 5, 6, 6, 7, 8, 8, 8};
  for (int64_t mt : plan) {
    Workload one = synthetic(1, mt, mt % 2 ? "odd" : "even");
    w.sessions.push_back(one.sessions[0]);
  }
  RunOptions o = options_for(server);
  o.max_concurrency = 3;
  RunResult r = run_ok(w, o);
  auto slos = SloSet::parse({"e2e=30"});
  RunSummary s = summarize(r, *slos);
  EXPECT_EQ(s.overall.n_requests, 10u);
  EXPECT_EQ(s.overall.n_ok, 4u);
  EXPECT_EQ(s.overall.errors, (std::map<std::string, size_t>{
                                  {"429", 2}, {"503", 1}, {"500", 1}, {"disconnected", 2}}));
  EXPECT_EQ(s.overall.n_good, 4u);
  ASSERT_EQ(s.classes.size(), 2u);
  EXPECT_EQ(s.classes[0].name, "even");
  EXPECT_EQ(s.classes[0].errors, (std::map<std::string, size_t>{{"503", 1}, {"disconnected", 2}}));
  EXPECT_EQ(s.classes[1].errors, (std::map<std::string, size_t>{{"429", 2}, {"500", 1}}));
  for (const auto& rec : r.requests) {
    if (rec.max_tokens == 6) {
      EXPECT_EQ(rec.n_content_chunks, 2);  // the two tokens before the drop were seen
      EXPECT_FALSE(std::isnan(rec.ttft_s));
    }
    if (rec.max_tokens == 3) {
      EXPECT_NE(rec.error_detail.find("fake error 429"), std::string::npos);
    }
  }
}

TEST(LoadgenEndToEnd, WholeResponsesWithoutStreaming) {
  FakeOpenAiServer server([](const FakeRequest&) {
    FakeBehavior b;
    b.first_token_delay_s = 0.02;
    return b;
  });
  RunOptions o = options_for(server);
  o.body.stream = false;
  o.body.endpoint = Endpoint::kChat;
  RunResult r = run_ok(synthetic(4, 6), o);
  for (const auto& rec : r.requests) {
    ASSERT_TRUE(rec.ok()) << rec.error << ": " << rec.error_detail;
    EXPECT_EQ(rec.completion_tokens, 6);
    EXPECT_GE(rec.e2e_s, 0.02);
    EXPECT_TRUE(std::isnan(rec.ttft_s));
  }
  for (const auto& q : server.requests()) {
    EXPECT_EQ(q.json["stream"], false);
    EXPECT_FALSE(q.json.contains("stream_options"));
  }
}

TEST(LoadgenEndToEnd, KeptAliveConnectionsAreReusedAndStaleOnesRetried) {
  {
    FakeOpenAiServer server;
    RunOptions o = options_for(server);
    o.max_concurrency = 1;
    RunResult r = run_ok(synthetic(5, 2), o);
    for (const auto& rec : r.requests) EXPECT_TRUE(rec.ok()) << rec.error;
    EXPECT_EQ(r.http.connections_opened, 1u);
    EXPECT_EQ(r.http.connections_reused, 4u);
    EXPECT_EQ(server.connections_accepted(), 1u);
  }
  {
    // The server promises keep-alive and closes anyway: each reuse finds a dead socket.
    FakeOpenAiServer server([](const FakeRequest&) {
      FakeBehavior b;
      b.close_despite_keep_alive = true;
      return b;
    });
    RunOptions o = options_for(server);
    o.max_concurrency = 1;
    RunResult r = run_ok(synthetic(4, 2), o);
    for (const auto& rec : r.requests) EXPECT_TRUE(rec.ok()) << rec.error << ": " << rec.error_detail;
    EXPECT_EQ(server.requests().size(), 4u);
    EXPECT_GE(r.http.stale_retries, 1u);
    EXPECT_EQ(r.http.connections_opened, 1u + r.http.stale_retries);
  }
}

TEST(LoadgenEndToEnd, TimeoutsAndRefusedConnections) {
  FakeOpenAiServer server([](const FakeRequest&) {
    FakeBehavior b;
    b.first_token_delay_s = 10.0;
    return b;
  });
  RunOptions o = options_for(server);
  o.timeout_s = 0.2;
  RunResult r = run_ok(synthetic(2, 2), o);
  for (const auto& rec : r.requests) {
    EXPECT_EQ(rec.error, "timeout");
    EXPECT_GE(rec.done_s - rec.sent_s, 0.2);
    EXPECT_LT(rec.done_s - rec.sent_s, 5.0);
  }

  // A port nobody listens on: bind one, then let it go.
  uint16_t port;
  {
    boost::asio::io_context io;
    boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
    port = a.local_endpoint().port();
  }
  RunOptions dead;
  dead.url = *parse_url("http://127.0.0.1:" + std::to_string(port));
  dead.timeout_s = 5;
  RunResult d = run_ok(synthetic(2, 2), dead);
  for (const auto& rec : d.requests) EXPECT_EQ(rec.error, "connect_error");
}

TEST(LoadgenEndToEnd, MultiTurnResendsHistoryWithTheServersReplies) {
  FakeOpenAiServer server([](const FakeRequest&) {
    FakeBehavior b;
    b.token_text = " yes";
    return b;
  });
  DatasetOptions d;
  d.dataset = "multi-turn";
  d.num_requests = 6;
  d.turns = 3;
  d.input_len = *LengthDist::parse("5", LengthSide::kInput);
  d.output_len = *LengthDist::parse("2", LengthSide::kOutput);
  auto w = build_workload(d);
  ASSERT_TRUE(w.ok());
  RunOptions o = options_for(server);
  o.body.endpoint = Endpoint::kChat;
  o.arrivals.rate_per_s = 50;
  RunResult r = run_ok(*w, o);
  for (const auto& rec : r.requests) ASSERT_TRUE(rec.ok()) << rec.error;
  // Turn k of a session goes out after turn k-1 ends.
  for (size_t i = 1; i < r.requests.size(); ++i) {
    if (r.requests[i].session == r.requests[i - 1].session) {
      EXPECT_GE(r.requests[i].sent_s, r.requests[i - 1].done_s);
    }
  }
  // Per session, bodies grow by one user and one assistant message per turn.
  std::map<std::string, std::vector<nlohmann::json>> by_first_user;
  for (const auto& q : server.requests()) {
    by_first_user[q.json["messages"][0]["content"].get<std::string>()].push_back(q.json["messages"]);
  }
  ASSERT_EQ(by_first_user.size(), 2u);
  for (auto& [first, bodies] : by_first_user) {
    std::sort(bodies.begin(), bodies.end(), [](const auto& a, const auto& b) { return a.size() < b.size(); });
    ASSERT_EQ(bodies.size(), 3u);
    for (size_t t = 0; t < 3; ++t) {
      ASSERT_EQ(bodies[t].size(), 2 * t + 1);
      if (t > 0) {
        EXPECT_EQ(bodies[t][2 * t - 1]["role"], "assistant");
        EXPECT_EQ(bodies[t][2 * t - 1]["content"], " yes yes");  // what the server said
        EXPECT_EQ(bodies[t][2 * t - 2], bodies[t - 1][2 * t - 2]);  // history is resent as it was
      }
    }
  }
}

TEST(LoadgenEndToEnd, ArrivalsFollowTheSchedule) {
  FakeOpenAiServer server;
  RunOptions o = options_for(server);
  o.arrivals.rate_per_s = 40;
  o.seed = 3;
  Workload w = synthetic(12, 1);
  RunResult r = run_ok(w, o);
  auto want = arrival_offsets(o.arrivals, 12, 3);
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_DOUBLE_EQ(r.requests[i].scheduled_s, want[i]);
    EXPECT_GE(r.requests[i].sent_s, want[i]);  // never early
  }
  EXPECT_GE(r.duration_s, want.back());
}

TEST(LoadgenEndToEnd, AThousandConcurrentStreamsOnOneThread) {
  FakeOpenAiServer server([](const FakeRequest&) {
    FakeBehavior b;
    b.awkward_splits = false;
    b.first_token_delay_s = 0.2;  // long enough for every request to be in flight at once
    b.token_interval_s = 0.01;
    return b;
  });
  // METRO_BENCH_E2E_STREAMS=4000 tries more by hand (the descriptor limit must allow 2n).
  const char* env = std::getenv("METRO_BENCH_E2E_STREAMS");
  const size_t n = env ? std::strtoul(env, nullptr, 10) : 1000;
  RunOptions o = options_for(server);
  RunResult r = run_ok(synthetic(n, 4), o);
  size_t ok = 0;
  for (const auto& rec : r.requests) ok += rec.ok();
  EXPECT_EQ(ok, n);
  EXPECT_EQ(r.peak_in_flight, n);
  EXPECT_GT(server.peak_concurrent_requests(), n / 2);
}

TEST(LoadgenEndToEnd, DiscoversTheModelName) {
  FakeOpenAiServer server;
  auto m = discover_model(*parse_url(server.url()), "", 5);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(*m, "fake-model");
}

}  // namespace
}  // namespace metro::loadgen
