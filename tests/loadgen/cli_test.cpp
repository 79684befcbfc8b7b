// `metro bench-serve` as a user runs it, against the in-process fake server.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loadgen/fake_openai_server.h"
#include "support/test_util.h"

namespace metro::loadgen {
namespace {

using metro::testing::run_metro;
using metro::testing::TempFile;
using testing::FakeBehavior;
using testing::FakeOpenAiServer;
using testing::FakeRequest;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(BenchServeCli, RunWritesReportJsonAndPlot) {
  FakeOpenAiServer server([](const FakeRequest& q) {
    FakeBehavior b;
    b.token_interval_s = 0.002;
    if (q.index == 2) b.status = 429;
    return b;
  });
  TempFile json_out(".json"), svg_out(".svg");
  auto r = run_metro({"bench-serve", "--url", server.url(), "--num-requests", "6", "--input-len", "20",
                      "--output-len", "5", "--max-concurrency", "2", "--classes", "realtime:1,batch:1",
                      "--slo", "ttft=5,realtime:tpot=1", "--seed", "4", "--json", json_out.path(),
                      "--plot", svg_out.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("5 ok, 1 failed of 6"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("429: 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("goodput"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "no progress line when stderr is not a TTY";
  auto j = nlohmann::json::parse(slurp(json_out.path()));
  EXPECT_EQ(j["config"]["model"], "fake-model");  // found through /v1/models
  EXPECT_EQ(j["config"]["num_requests"], 6);
  EXPECT_EQ(j["config"]["input_len"], "fixed:20");
  EXPECT_EQ(j["config"]["seed"], 4);
  EXPECT_EQ(j["runs"][0]["overall"]["ok"], 5);
  EXPECT_EQ(j["runs"][0]["overall"]["output_tokens"]["total"], 25);
  EXPECT_EQ(j["runs"][0]["overall"]["input_tokens"]["mean"], 20.0);
  EXPECT_EQ(j["runs"][0]["classes"].size(), 2u);
  const std::string svg = slurp(svg_out.path());
  EXPECT_NE(svg.find("TTFT CDF"), std::string::npos);
  EXPECT_TRUE(svg.ends_with("</svg>\n"));
  std::set<std::string> classes;
  for (const auto& q : server.requests()) {
    if (q.method == "POST") classes.insert(q.header("x-metro-class"));
  }
  EXPECT_EQ(classes, (std::set<std::string>{"realtime", "batch"}));
}

TEST(BenchServeCli, RateSweepRunsOncePerRate) {
  FakeOpenAiServer server;
  TempFile json_out(".json"), svg_out(".svg");
  auto r = run_metro({"bench-serve", "--url", server.url(), "--model", "m", "--num-requests", "4",
                      "--input-len", "4", "--output-len", "2", "--rate-sweep", "50,inf", "--json",
                      json_out.path(), "--plot", svg_out.path(), "--endpoint", "chat"});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("rate sweep"), std::string::npos) << r.out;
  auto j = nlohmann::json::parse(slurp(json_out.path()));
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][0]["rate_per_s"], 50.0);
  EXPECT_TRUE(j["runs"][1]["rate_per_s"].is_null());
  EXPECT_EQ(j["config"]["rates"], nlohmann::json::parse(R"([50.0, "inf"])"));
  EXPECT_NE(slurp(svg_out.path()).find("output token throughput"), std::string::npos);
  EXPECT_EQ(server.requests().size(), 8u);  // no /v1/models lookup: --model was given
}

TEST(BenchServeCli, BadFlagsAreOneLineErrors) {
  struct Case {
    std::vector<std::string> args;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {{"--url", "https://x"}, "https"},
      {{"--url", "http://127.0.0.1:1", "--rate", "0"}, "rate"},
      {{"--url", "http://127.0.0.1:1", "--input-len", "gauss"}, "unknown length"},
      {{"--url", "http://127.0.0.1:1", "--slo", "ttft"}, "--slo"},
      {{"--url", "http://127.0.0.1:1", "--classes", "a:-1"}, "--classes"},
      {{"--url", "http://127.0.0.1:1", "--rate", "2", "--rate-sweep", "1,2"}, "not both"},
      {{"--url", "http://127.0.0.1:1", "--dataset", "/nope.jsonl"}, "cannot open"},
      {{"--url", "http://127.0.0.1:1", "--burstiness", "0"}, "burstiness"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"bench-serve"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    auto r = run_metro(args);
    EXPECT_EQ(r.exit_code, 1) << c.needle << ": " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  }
  auto missing = run_metro({"bench-serve"});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("--url"), std::string::npos) << missing.err;
}

TEST(BenchServeCli, NoSuccessIsExitOne) {
  FakeOpenAiServer server([](const FakeRequest&) {
    FakeBehavior b;
    b.status = 503;
    return b;
  });
  auto r = run_metro({"bench-serve", "--url", server.url(), "--model", "m", "--num-requests", "3",
                      "--input-len", "4", "--output-len", "2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("503: 3"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("no request succeeded"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace metro::loadgen
