#include "engine/stop_matcher.h"

#include <gtest/gtest.h>

namespace metro::engine {
namespace {

// Feeds `pieces` and returns (emitted text, matched).
std::pair<std::string, bool> feed(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& p : pieces) {
    bool matched = false;
    out += m.push(p, &matched);
    if (matched) return {out, true};
  }
  return {out + m.flush(), false};
}

TEST(StopMatcher, StopSpanningTokensIsNeverEmitted) {
  StopMatcher m({"</end>"});
  auto [out, matched] = feed(m, {"Hello </", "en", "d> more"});
  EXPECT_TRUE(matched);
  EXPECT_EQ(out, "Hello ");
}

TEST(StopMatcher, HeldTextIsReleasedWhenItStopsLookingLikeAStop) {
  StopMatcher m({"STOP"});
  bool matched = false;
  EXPECT_EQ(m.push("abc ST", &matched), "abc ");
  EXPECT_FALSE(matched);
  EXPECT_EQ(m.push("ART", &matched), "START");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
  StopMatcher m({"zz", "b"});
  auto [out, matched] = feed(m, {"aazzb"});
  EXPECT_TRUE(matched);
  EXPECT_EQ(out, "aa");
}

TEST(StopMatcher, NoStopsPassThroughAndFlushReturnsTheTail) {
  StopMatcher none({});
  bool matched = false;
  EXPECT_EQ(none.push("x", &matched), "x");
  StopMatcher m({"\n\n"});
  auto [out, hit] = feed(m, {"line\n"});
  EXPECT_FALSE(hit);
  EXPECT_EQ(out, "line\n");
}

TEST(StopMatcher, MultibyteStops) {
  StopMatcher m({"。"});
  auto [out, matched] = feed(m, {"你好", "。再见"});
  EXPECT_TRUE(matched);
  EXPECT_EQ(out, "你好");
}

}  // namespace
}  // namespace metro::engine
