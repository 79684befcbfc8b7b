#include <gtest/gtest.h>

#include <cmath>

#include "base/hash.h"
#include "base/sla.h"

namespace metro {
namespace {

void expect_error(std::string_view spec, std::string_view must_mention) {
  auto r = parse_sla_spec(spec);
  ASSERT_FALSE(r.ok()) << spec;
  EXPECT_NE(r.status().message().find(must_mention), std::string::npos)
      << "spec: " << spec << "\nmessage: " << r.status().message();
}

TEST(SlaConfig, DefaultsAreDocumented) {
  SlaConfig c;
  EXPECT_DOUBLE_EQ(c.of(SlaClass::kRealtime).ttft_s, 0.5);
  EXPECT_DOUBLE_EQ(c.of(SlaClass::kRealtime).tpot_s, 0.1);
  EXPECT_DOUBLE_EQ(c.of(SlaClass::kStandard).ttft_s, 2.0);
  EXPECT_DOUBLE_EQ(c.of(SlaClass::kStandard).tpot_s, 0.2);
  EXPECT_DOUBLE_EQ(c.of(SlaClass::kBatch).ttft_s, 30.0);
  EXPECT_DOUBLE_EQ(c.of(SlaClass::kBatch).starve_s, 120.0);
  for (const auto& k : c.classes) EXPECT_DOUBLE_EQ(k.starve_s, kStarvePerTtft * k.ttft_s);
  auto empty = parse_sla_spec("   ");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(format_sla_spec(*empty), format_sla_spec(c));
}

TEST(SlaConfig, ParsesTheIssueExample) {
  auto r = parse_sla_spec("realtime:ttft=0.5,tpot=0.1 standard:ttft=2,tpot=0.2 batch:ttft=30");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_DOUBLE_EQ(r->of(SlaClass::kRealtime).ttft_s, 0.5);
  EXPECT_DOUBLE_EQ(r->of(SlaClass::kStandard).tpot_s, 0.2);
  EXPECT_DOUBLE_EQ(r->of(SlaClass::kBatch).ttft_s, 30.0);
  EXPECT_DOUBLE_EQ(r->of(SlaClass::kBatch).tpot_s, 1.0);  // untouched default
}

TEST(SlaConfig, UnitsSeparatorsAndOverrides) {
  auto r = parse_sla_spec("realtime:ttft=250ms,tpot=50ms;batch:ttft=10s,starve=600,quantum=8192\tstandard:tpot=0.3");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_DOUBLE_EQ(r->of(SlaClass::kRealtime).ttft_s, 0.25);
  EXPECT_DOUBLE_EQ(r->of(SlaClass::kRealtime).tpot_s, 0.05);
  EXPECT_DOUBLE_EQ(r->of(SlaClass::kRealtime).starve_s, 1.0) << "follows ttft when not given";
  EXPECT_DOUBLE_EQ(r->of(SlaClass::kBatch).ttft_s, 10.0);
  EXPECT_DOUBLE_EQ(r->of(SlaClass::kBatch).starve_s, 600.0) << "explicit starve wins";
  EXPECT_EQ(r->of(SlaClass::kBatch).quantum_tokens, 8192);
  EXPECT_DOUBLE_EQ(r->of(SlaClass::kStandard).tpot_s, 0.3);
  // The canonical form reads back to the same config.
  auto again = parse_sla_spec(format_sla_spec(*r));
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(format_sla_spec(*again), format_sla_spec(*r));
  EXPECT_DOUBLE_EQ(again->of(SlaClass::kBatch).starve_s, 600.0);
}

TEST(SlaConfig, ErrorsNameTheBadToken) {
  expect_error("premium:ttft=1", "'premium'");
  expect_error("realtime:latency=1", "'latency'");
  expect_error("realtime:ttft=nan", "ttft=nan");
  expect_error("realtime:ttft=-1", "ttft=-1");
  expect_error("realtime:ttft=0", "> 0");
  expect_error("realtime:ttft=inf", "ttft=inf");
  expect_error("realtime:ttft=1e999", "ttft=1e999");
  expect_error("realtime:ttft=100000", "86400");
  expect_error("realtime:ttft=fast", "'fast'");
  expect_error("realtime:ttft=1h", "'1h'");
  expect_error("realtime:ttft=+1", "'+1'");
  expect_error("realtime:quantum=0", "quantum=0");
  expect_error("realtime:quantum=1.5", "'1.5'");
  expect_error("realtime:ttft", "'ttft'");
  expect_error("realtime:=1", "'=1'");
  expect_error("realtime:ttft=1,", "trailing ','");
  expect_error("realtime:ttft=1,,tpot=1", "''");
  expect_error("realtime", "'realtime'");
  expect_error("realtime:", "names no setting");
  expect_error("realtime:ttft=1 realtime:tpot=1", "twice");
  expect_error("realtime:ttft=1,ttft=2", "'ttft' set twice");
}

TEST(SlaConfig, RandomSpecsNeverCrashAndAcceptedOnesRoundTrip) {
  // Mutations of valid specs: byte flips, cuts and splices over the grammar's alphabet.
  const std::string alphabet = "realtimestandardbatch:=,; ttftpotstarvequantum0123456789.-+emsinfa\t";
  const std::string seeds[] = {"realtime:ttft=0.5,tpot=0.1 standard:ttft=2,tpot=0.2 batch:ttft=30",
                               "batch:starve=600,quantum=8192;realtime:ttft=250ms"};
  uint64_t x = 1;
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string spec = seeds[i % 2];
    const int edits = 1 + static_cast<int>((x = mix64(x)) % 4);
    for (int k = 0; k < edits && !spec.empty(); ++k) {
      x = mix64(x);
      const size_t pos = x % spec.size();
      switch ((x >> 32) % 3) {
        case 0: spec[pos] = alphabet[(x >> 40) % alphabet.size()]; break;
        case 1: spec.erase(pos, 1 + (x >> 40) % 3); break;
        default: spec.insert(pos, 1, alphabet[(x >> 40) % alphabet.size()]); break;
      }
    }
    auto r = parse_sla_spec(spec);
    if (!r.ok()) {
      EXPECT_FALSE(r.status().message().empty());
      continue;
    }
    ++accepted;
    for (const auto& c : r->classes) {
      ASSERT_TRUE(std::isfinite(c.ttft_s) && c.ttft_s > 0.0 && c.ttft_s <= kMaxSloSeconds) << spec;
      ASSERT_TRUE(std::isfinite(c.tpot_s) && c.tpot_s > 0.0) << spec;
      ASSERT_TRUE(c.quantum_tokens >= 1 && c.quantum_tokens <= kMaxQuantumTokens) << spec;
    }
    auto again = parse_sla_spec(format_sla_spec(*r));
    ASSERT_TRUE(again.ok()) << spec;
    EXPECT_EQ(format_sla_spec(*again), format_sla_spec(*r)) << spec;
  }
  EXPECT_GT(accepted, 100);
}

TEST(SlaConfig, ParsesOverABase) {
  SlaConfig base;
  base.of(SlaClass::kBatch).tpot_s = 5.0;
  auto r = parse_sla_spec("realtime:ttft=1", base);
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->of(SlaClass::kBatch).tpot_s, 5.0);
  EXPECT_DOUBLE_EQ(r->of(SlaClass::kRealtime).ttft_s, 1.0);
}

}  // namespace
}  // namespace metro
