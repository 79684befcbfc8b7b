#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <regex>

#include "loadgen/report_json.h"
#include "loadgen/report_text.h"
#include "loadgen/svg_plot.h"

namespace metro::loadgen {
namespace {

using nlohmann::json;

RequestRecord rec(const std::string& cls, double ttft, int64_t tokens, std::string error = "") {
  RequestRecord r;
  r.class_name = cls;
  r.sent_s = 0.1;
  r.scheduled_s = 0.05;
  r.done_s = 1.0;
  r.error = std::move(error);
  r.http_status = r.error.empty() ? 200 : 503;
  if (r.error.empty()) {
    r.ttft_s = ttft;
    r.e2e_s = ttft + 0.01 * static_cast<double>(tokens);
    r.tpot_s = 0.01;
    for (int64_t i = 1; i < tokens; ++i) r.itl_s.push_back(0.005 + 0.001 * static_cast<double>(i));
    r.completion_tokens = tokens;
    r.prompt_tokens = 12;
    r.cached_tokens = 4;
    r.usage_reported = true;
    r.finish_reason = "length";
  }
  r.input_words = 12;
  r.max_tokens = tokens;
  return r;
}

RunResult sample_run(double rate) {
  RunResult run;
  run.rate_per_s = rate;
  run.duration_s = 2.0;
  run.peak_in_flight = 3;
  run.requests = {rec("realtime", 0.05, 8), rec("realtime", 0.2, 8), rec("batch", 0.4, 16),
                  rec("batch", 0, 0, "503"), rec("batch <&>", 0.3, 4)};
  return run;
}

TEST(LoadgenReportJson, SchemaHoldsEveryFigure) {
  auto slos = SloSet::parse({"ttft=0.25"});
  ASSERT_TRUE(slos.ok());
  std::vector<RunResult> runs = {sample_run(std::numeric_limits<double>::infinity()), sample_run(2.0)};
  std::vector<RunSummary> sums = {summarize(runs[0], *slos), summarize(runs[1], *slos)};
  json config = {{"url", "http://x"}, {"seed", 1}};
  // Through text, as a file would be read back.
  json j = json::parse(report_to_json(config, sums, runs).dump(2));
  EXPECT_EQ(j["tool"], "metro bench-serve");
  EXPECT_EQ(j["schema_version"], kJsonSchemaVersion);
  EXPECT_EQ(j["config"], config);
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_TRUE(j["runs"][0]["rate_per_s"].is_null());  // all at once
  EXPECT_EQ(j["runs"][1]["rate_per_s"], 2.0);
  const json& run = j["runs"][1];
  for (const char* k : {"duration_s", "peak_in_flight", "http", "overall", "classes", "requests"}) {
    EXPECT_TRUE(run.contains(k)) << k;
  }
  const json& o = run["overall"];
  EXPECT_EQ(o["requests"], 5);
  EXPECT_EQ(o["ok"], 4);
  EXPECT_EQ(o["failed"], 1);
  EXPECT_EQ(o["errors_by_status"], json({{"503", 1}}));
  EXPECT_EQ(o["input_tokens"]["total"], 48);
  EXPECT_EQ(o["input_tokens"]["cached"], 16);
  EXPECT_EQ(o["output_tokens"]["total"], 36);
  EXPECT_DOUBLE_EQ(o["throughput"]["output_tokens_per_s"].get<double>(), 18.0);
  EXPECT_DOUBLE_EQ(o["throughput"]["requests_per_s"].get<double>(), 2.0);
  for (const char* metric : {"ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s"}) {
    for (const char* k : {"n", "mean", "p50", "p90", "p99", "min", "max"}) {
      ASSERT_TRUE(o[metric].contains(k)) << metric << "." << k;
    }
  }
  EXPECT_EQ(o["ttft_s"]["n"], 4);
  EXPECT_DOUBLE_EQ(o["ttft_s"]["p50"].get<double>(), 0.25);  // 0.05 0.2 0.3 0.4
  EXPECT_EQ(o["goodput"]["good_requests"], 2);  // TTFT 0.05 and 0.2 are within 0.25
  EXPECT_EQ(o["goodput"]["slo"], json({{"ttft_s", 0.25}}));
  EXPECT_EQ(run["classes"].size(), 3u);
  EXPECT_EQ(run["classes"]["realtime"]["requests"], 2);
  EXPECT_EQ(run["classes"]["batch"]["errors_by_status"]["503"], 1);
  ASSERT_EQ(run["requests"].size(), 5u);
  const json& failed = run["requests"][3];
  EXPECT_EQ(failed["error"], "503");
  EXPECT_TRUE(failed["ttft_s"].is_null());
  EXPECT_TRUE(failed["e2e_s"].is_null());
  const json& good = run["requests"][0];
  for (const char* k : {"session", "turn", "class", "http_status", "error", "scheduled_s", "sent_s",
                        "done_s", "ttft_s", "tpot_s", "e2e_s", "max_itl_s", "prompt_tokens",
                        "cached_tokens", "completion_tokens", "usage_reported", "finish_reason"}) {
    EXPECT_TRUE(good.contains(k)) << k;
  }
  EXPECT_TRUE(good["error"].is_null());
  EXPECT_DOUBLE_EQ(good["max_itl_s"].get<double>(), 0.012);
}

// A rough XML well-formedness check: tags nest and close, attributes are quoted, text has
// no raw '<' and every '&' starts an entity.
::testing::AssertionResult well_formed_svg(const std::string& s) {
  std::vector<std::string> stack;
  size_t pos = 0, elements = 0;
  if (!s.starts_with("<?xml")) return ::testing::AssertionFailure() << "no XML declaration";
  pos = s.find("?>") + 2;
  const std::regex attr_re(R"(\s+[a-zA-Z_:][-a-zA-Z0-9_:.]*="[^"<]*")");
  const std::regex entity_re(R"(^&(amp|lt|gt|quot|apos);)");
  while (pos < s.size()) {
    size_t lt = s.find('<', pos);
    std::string text = s.substr(pos, lt == std::string::npos ? std::string::npos : lt - pos);
    for (size_t a = text.find('&'); a != std::string::npos; a = text.find('&', a + 1)) {
      if (!std::regex_search(text.substr(a, 8), entity_re)) {
        return ::testing::AssertionFailure() << "bare '&' in text near " << text.substr(a, 20);
      }
    }
    if (lt == std::string::npos) break;
    if (stack.empty() && elements > 0) return ::testing::AssertionFailure() << "a second root element";
    size_t gt = s.find('>', lt);
    if (gt == std::string::npos) return ::testing::AssertionFailure() << "unclosed tag";
    std::string tag = s.substr(lt + 1, gt - lt - 1);
    pos = gt + 1;
    if (tag.starts_with("/")) {
      if (stack.empty() || stack.back() != tag.substr(1)) {
        return ::testing::AssertionFailure() << "</" << tag.substr(1) << "> closes "
                                             << (stack.empty() ? "nothing" : stack.back());
      }
      stack.pop_back();
      continue;
    }
    const bool self_closing = tag.ends_with("/");
    if (self_closing) tag.pop_back();
    size_t name_end = tag.find_first_of(" \n\t");
    std::string name = tag.substr(0, name_end);
    if (name.empty()) return ::testing::AssertionFailure() << "empty tag name";
    std::string attrs = name_end == std::string::npos ? "" : tag.substr(name_end);
    std::string rest = std::regex_replace(attrs, attr_re, "");
    if (rest.find_first_not_of(" \n\t") != std::string::npos) {
      return ::testing::AssertionFailure() << "bad attributes in <" << name << ">: " << rest;
    }
    ++elements;
    if (!self_closing) stack.push_back(name);
  }
  if (!stack.empty()) return ::testing::AssertionFailure() << "<" << stack.back() << "> not closed";
  return ::testing::AssertionSuccess();
}

TEST(LoadgenSvg, LatencyCdfIsWellFormedAndComplete) {
  RunResult run = sample_run(4.0);
  RunSummary s = summarize(run, SloSet());
  std::string svg = latency_cdf_svg(run, s, "title with <markup> & \"quotes\"");
  EXPECT_TRUE(well_formed_svg(svg));
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  for (const char* panel : {"TTFT CDF", "TPOT CDF", "ITL CDF", "E2E CDF"}) {
    EXPECT_NE(svg.find(panel), std::string::npos) << panel;
  }
  // Four panels, one curve per group (all + 3 classes).
  size_t polylines = 0;
  for (size_t p = svg.find("<polyline"); p != std::string::npos; p = svg.find("<polyline", p + 1)) ++polylines;
  EXPECT_EQ(polylines, 16u);
  EXPECT_NE(svg.find("batch &lt;&amp;&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("log scale"), std::string::npos);  // every spread here is under 100x
  run.requests[0].itl_s.push_back(2.0);  // 400x the smallest gap
  std::string tail = latency_cdf_svg(run, summarize(run, SloSet()), "tail");
  EXPECT_TRUE(well_formed_svg(tail));
  EXPECT_NE(tail.find("ITL (s), log scale"), std::string::npos);
  EXPECT_NE(tail.find(">0.001<"), std::string::npos);  // decades from 1 ms
  EXPECT_NE(tail.find(">10<"), std::string::npos);     // to 10 s
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(LoadgenSvg, SweepIsWellFormedWithAnInfiniteRate) {
  std::vector<RunSummary> sums;
  for (double rate : {1.0, 2.0, std::numeric_limits<double>::infinity()}) {
    sums.push_back(summarize(sample_run(rate), SloSet()));
  }
  std::string svg = sweep_svg(sums, "sweep");
  EXPECT_TRUE(well_formed_svg(svg));
  EXPECT_NE(svg.find(">inf<"), std::string::npos);
  EXPECT_NE(svg.find(">2/s<"), std::string::npos);
  EXPECT_NE(svg.find("p99 time to first token"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_TRUE(well_formed_svg(sweep_svg({}, "empty")));
  // The checker itself catches broken documents.
  EXPECT_FALSE(well_formed_svg("<?xml?><svg><g></svg>"));
  EXPECT_FALSE(well_formed_svg("<?xml?><svg a=b></svg>"));
  EXPECT_FALSE(well_formed_svg("<?xml?><svg><text>a & b</text></svg>"));
}

TEST(LoadgenReportText, ReportAndProgress) {
  auto slos = SloSet::parse({"ttft=0.25"});
  RunSummary s = summarize(sample_run(4.0), *slos);
  std::string text = format_run_report(s, "a title");
  EXPECT_NE(text.find("== a title =="), std::string::npos);
  EXPECT_NE(text.find("4 ok, 1 failed of 5"), std::string::npos) << text;
  EXPECT_NE(text.find("503: 1"), std::string::npos);
  EXPECT_NE(text.find("from prefix cache"), std::string::npos);
  EXPECT_NE(text.find("goodput"), std::string::npos);
  EXPECT_NE(text.find("realtime"), std::string::npos);
  EXPECT_NE(text.find("TTFT"), std::string::npos);
  std::vector<RunSummary> sweep = {s, s};
  EXPECT_NE(format_sweep_table(sweep).find("4/s"), std::string::npos);
  Progress p;
  p.total = 64;
  p.done = 7;
  p.in_flight = 16;
  p.output_tokens = 100;
  p.elapsed_s = 2;
  EXPECT_EQ(progress_line(p), "[ 7/64] 16 in flight, 0 queued, 0 failed, 100 tokens, 50.0 tok/s, 2.0 s");
}

}  // namespace
}  // namespace metro::loadgen
