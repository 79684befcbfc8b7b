// API keys (constant-time compare, key file format) and the Prometheus exposition.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <sstream>

#include "server/auth.h"
#include "server/metrics.h"

namespace metro::server {
namespace {

TEST(AuthTest, ConstantTimeEqual) {
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_TRUE(constant_time_equal("sk-secret-1", "sk-secret-1"));
  EXPECT_FALSE(constant_time_equal("sk-secret-1", "sk-secret-2"));
  EXPECT_FALSE(constant_time_equal("sk-secret", "sk-secret-1"));  // prefix
  EXPECT_FALSE(constant_time_equal("sk-secret-1", "sk-secret"));
  EXPECT_FALSE(constant_time_equal("", "x"));
  EXPECT_FALSE(constant_time_equal(std::string("a\0b", 3), std::string("a\0c", 3)));
}

TEST(AuthTest, KeyFileAndTenants) {
  auto keys = ApiKeys::parse("# comment\n\nsk-aaaaaaaa team-a\n  sk-bbbbbbbb   \nsk-cccccccc\tteam-c\r\n");
  ASSERT_TRUE(keys.ok()) << keys.status().message();
  EXPECT_TRUE(keys->enabled());
  EXPECT_EQ(keys->size(), 3u);
  EXPECT_EQ(keys->authenticate("Bearer sk-aaaaaaaa"), std::optional<std::string>("team-a"));
  EXPECT_EQ(keys->authenticate("bearer sk-bbbbbbbb"), std::optional<std::string>(""));
  EXPECT_EQ(keys->authenticate("Bearer sk-cccccccc"), std::optional<std::string>("team-c"));
  EXPECT_FALSE(keys->authenticate("Bearer sk-aaaaaaa"));
  EXPECT_FALSE(keys->authenticate("Bearer sk-aaaaaaaab"));
  EXPECT_FALSE(keys->authenticate("sk-aaaaaaaa"));
  EXPECT_FALSE(keys->authenticate("Basic sk-aaaaaaaa"));
  EXPECT_FALSE(keys->authenticate(""));
  EXPECT_FALSE(keys->authenticate("Bearer "));
}

TEST(AuthTest, TenantSettingsFromTheKeyFile) {
  auto keys = ApiKeys::parse(
      "sk-aaaaaaaa team-a class=realtime tpm=6000 burst=9000 concurrency=4\n"
      "sk-a2a2a2a2 team-a\n"
      "sk-bbbbbbbb team-b tpm=100 capture=0.25\n"
      "sk-cccccccc class=batch\n");
  ASSERT_TRUE(keys.ok()) << keys.status().message();
  const TenantSettings* a = keys->tenant_settings("team-a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->default_class, SlaClass::kRealtime);
  EXPECT_EQ(a->tokens_per_minute, 6000.0);
  EXPECT_EQ(a->burst_tokens, 9000.0);
  EXPECT_EQ(a->max_concurrent, 4);
  const TenantSettings* b = keys->tenant_settings("team-b");
  ASSERT_NE(b, nullptr);
  EXPECT_FALSE(b->default_class.has_value());
  EXPECT_EQ(b->tokens_per_minute, 100.0);
  EXPECT_EQ(b->max_concurrent, 0);
  EXPECT_EQ(b->capture_share, std::optional<double>(0.25));
  EXPECT_FALSE(a->capture_share.has_value());
  // A key without a tenant name belongs to the anonymous tenant "".
  EXPECT_EQ(keys->authenticate("Bearer sk-cccccccc"), std::optional<std::string>(""));
  ASSERT_NE(keys->tenant_settings(""), nullptr);
  EXPECT_EQ(keys->tenant_settings("")->default_class, SlaClass::kBatch);
  EXPECT_EQ(keys->tenant_settings("nobody"), nullptr);
  EXPECT_EQ(keys->tenants().size(), 3u);
  EXPECT_EQ(keys->authenticate("Bearer sk-a2a2a2a2"), std::optional<std::string>("team-a"));

  for (const char* bad : {"sk-aaaaaaaa t class=urgent\n", "sk-aaaaaaaa t tpm=-1\n", "sk-aaaaaaaa t tpm=nan\n",
                          "sk-aaaaaaaa t concurrency=1.5\n", "sk-aaaaaaaa t speed=3\n", "sk-aaaaaaaa t tpm=\n",
                          "sk-aaaaaaaa t tpm=5 extra\n", "sk-aaaaaaaa t capture=1.5\n", "sk-aaaaaaaa t capture=x\n",
                          "sk-aaaaaaaa t tpm=5\nsk-bbbbbbbb t tpm=6\n"}) {
    auto k = ApiKeys::parse(bad);
    EXPECT_FALSE(k.ok()) << bad;
    if (!k.ok()) {
      EXPECT_EQ(k.status().message().find("sk-"), std::string::npos) << k.status().message();
    }
  }
}

TEST(AuthTest, KeyFileErrorsNeverEchoKeys) {
  auto short_key = ApiKeys::parse("abc\n");
  ASSERT_FALSE(short_key.ok());
  EXPECT_EQ(short_key.status().message().find("abc"), std::string::npos);
  EXPECT_NE(short_key.status().message().find("line 1"), std::string::npos);
  auto extra = ApiKeys::parse("sk-secretkey team extra\n");
  ASSERT_FALSE(extra.ok());
  EXPECT_EQ(extra.status().message().find("sk-secretkey"), std::string::npos);
  EXPECT_FALSE(ApiKeys::parse("# nothing\n").ok());
  auto missing = ApiKeys::load("/nonexistent/dir/keys.txt");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message().find("/nonexistent"), std::string::npos);
}

// Checks every line against the text format and returns samples by "name{labels}".
std::map<std::string, double> parse_exposition(const std::string& text) {
  static const std::regex kComment(R"(^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$)");
  static const std::regex kSample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\.)*",?)*\})? (-?[0-9.eE+-]+|\+Inf|-Inf|NaN)$)");
  std::map<std::string, double> samples;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("#", 0) == 0) {
      EXPECT_TRUE(std::regex_match(line, kComment)) << line;
      continue;
    }
    std::smatch m;
    EXPECT_TRUE(std::regex_match(line, m, kSample)) << line;
    const size_t sp = line.rfind(' ');
    samples[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  EXPECT_TRUE(text.empty() || text.back() == '\n');
  return samples;
}

TEST(MetricsTest, HistogramBucketsAreCumulative) {
  Histogram h({0.1, 1.0, 10.0});
  for (double v : {0.05, 0.1, 0.5, 5.0, 50.0}) h.observe(v);
  h.observe(std::numeric_limits<double>::quiet_NaN());  // ignored
  auto s = h.snapshot();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{2, 3, 4, 5}));
  EXPECT_EQ(s.count, 5u);
  EXPECT_DOUBLE_EQ(s.sum, 55.65);
}

TEST(MetricsTest, ExpositionIsValidPrometheusText) {
  ServerMetrics m;
  m.count_request("/v1/chat/completions", 200);
  m.count_request("/v1/chat/completions", 200);
  m.count_request("/v1/chat/completions", 400);
  m.count_request("/wp-admin/\"evil\"\n", 404);  // unknown paths share one label
  m.observe_ttft(0.3);
  m.observe_tpot(0.02);
  m.observe_e2e(1.5);
  // Another layer's collector writing a family with per-model series, twice.
  metrics::Registry registry;
  metrics::Registration http = registry.add([&](metrics::Exposition& e) { m.collect(e); });
  auto engine_series = [](const std::string& model, double running) {
    return [model, running](metrics::Exposition& e) {
      e.gauge("metro_requests_running", "Sequences running.", metrics::labels({{"model", model}}), running);
      e.histogram("metro_engine_step_duration_seconds", "Duration of an engine step.",
                  metrics::labels({{"model", model}}), {0.001, 0.01}, {1, 3}, 4, nullptr);
    };
  };
  metrics::Registration a = registry.add(engine_series("a", 3));
  const std::string text = [&] {
    metrics::Registration b = registry.add(engine_series("b\"x", 1));
    return registry.render();
  }();
  auto s = parse_exposition(text);
  EXPECT_EQ(s["metro_http_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"}"], 2);
  EXPECT_EQ(s["metro_http_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"}"], 1);
  EXPECT_EQ(s["metro_http_requests_total{endpoint=\"other\",status=\"404\"}"], 1);
  EXPECT_EQ(s["metro_time_to_first_token_seconds_bucket{le=\"0.25\"}"], 0);
  EXPECT_EQ(s["metro_time_to_first_token_seconds_bucket{le=\"0.5\"}"], 1);
  EXPECT_EQ(s["metro_time_to_first_token_seconds_bucket{le=\"+Inf\"}"], 1);
  EXPECT_EQ(s["metro_time_to_first_token_seconds_count"], 1);
  EXPECT_DOUBLE_EQ(s["metro_e2e_request_latency_seconds_sum"], 1.5);
  EXPECT_EQ(s["metro_requests_running{model=\"a\"}"], 3);
  EXPECT_EQ(s["metro_requests_running{model=\"b\\\"x\"}"], 1);  // label values escaped
  EXPECT_EQ(s["metro_engine_step_duration_seconds_bucket{model=\"a\",le=\"0.01\"}"], 3);
  EXPECT_EQ(s["metro_engine_step_duration_seconds_bucket{model=\"a\",le=\"+Inf\"}"], 4);
  EXPECT_EQ(s["metro_engine_step_duration_seconds_count{model=\"a\"}"], 4);
  EXPECT_EQ(s.count("metro_engine_step_duration_seconds_sum{model=\"a\"}"), 0u);  // no sum given
  // One HELP and TYPE per family, its samples right after it, whatever wrote them.
  EXPECT_EQ(text.find("# TYPE metro_requests_running gauge\nmetro_requests_running{model=\"a\"} 3\n"
                      "metro_requests_running{model=\"b\\\"x\"} 1\n"),
            text.find("# TYPE metro_requests_running gauge"));
  EXPECT_EQ(text.find("# TYPE metro_requests_running"), text.rfind("# TYPE metro_requests_running"));
  EXPECT_NE(text.find("# TYPE metro_time_per_output_token_seconds histogram\n"), std::string::npos);
  // A registration that ends takes its series with it.
  auto after = parse_exposition(registry.render());
  EXPECT_EQ(after.count("metro_requests_running{model=\"b\\\"x\"}"), 0u);
  EXPECT_EQ(after["metro_requests_running{model=\"a\"}"], 3);
}

TEST(MetricsTest, LabelEscaping) { EXPECT_EQ(metrics::escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd"); }

}  // namespace
}  // namespace metro::server
