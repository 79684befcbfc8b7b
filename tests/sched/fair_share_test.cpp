#include <gtest/gtest.h>

#include "sched/fair_share.h"

namespace metro::sched {
namespace {

constexpr SlaClass kStd = SlaClass::kStandard;

TEST(VirtualTokenCounter, ChargesWeightedTokens) {
  VirtualTokenCounter v({.prompt = 1.0, .output = 2.0});
  v.on_request_added(kStd, "a");
  v.charge(kStd, "a", 100, 10);
  EXPECT_DOUBLE_EQ(v.counter(kStd, "a"), 120.0);
  EXPECT_EQ(v.active_requests(kStd, "a"), 1);
  EXPECT_EQ(v.n_active_tenants(kStd), 1);
  // Classes are separate.
  EXPECT_DOUBLE_EQ(v.counter(SlaClass::kBatch, "a"), 0.0);
}

TEST(VirtualTokenCounter, NewlyActiveTenantIsLiftedToTheActiveMinimum) {
  VirtualTokenCounter v;
  v.on_request_added(kStd, "a");
  v.on_request_added(kStd, "b");
  v.charge(kStd, "a", 1000, 0);
  v.charge(kStd, "b", 400, 0);
  v.on_request_added(kStd, "c");
  EXPECT_DOUBLE_EQ(v.counter(kStd, "c"), 400.0);
  // A second request of an already active tenant changes nothing.
  v.on_request_added(kStd, "c");
  EXPECT_DOUBLE_EQ(v.counter(kStd, "c"), 400.0);
}

TEST(VirtualTokenCounter, IdleTimeBanksNoCredit) {
  VirtualTokenCounter v;
  v.on_request_added(kStd, "quiet");
  v.on_request_added(kStd, "busy");
  v.charge(kStd, "quiet", 10, 0);
  v.on_request_removed(kStd, "quiet");  // quiet goes idle at 10
  v.charge(kStd, "busy", 5000, 0);      // busy is served alone
  v.on_request_added(kStd, "quiet");    // quiet returns
  EXPECT_DOUBLE_EQ(v.counter(kStd, "quiet"), 5000.0);
}

TEST(VirtualTokenCounter, ReturningTenantKeepsAHigherCounter) {
  VirtualTokenCounter v;
  v.on_request_added(kStd, "a");
  v.on_request_added(kStd, "b");
  v.charge(kStd, "a", 9000, 0);
  v.on_request_removed(kStd, "a");
  v.on_request_added(kStd, "a");  // a cannot shed its counter by going idle for a moment
  EXPECT_DOUBLE_EQ(v.counter(kStd, "a"), 9000.0);
}

TEST(VirtualTokenCounter, IdleTenantsArePrunedWithoutLosingFairness) {
  VirtualTokenCounter v;
  v.on_request_added(kStd, "keep");
  v.charge(kStd, "keep", 100, 0);
  for (int i = 0; i < 3000; ++i) {
    const std::string t = "t" + std::to_string(i);
    v.on_request_added(kStd, t);
    v.on_request_removed(kStd, t);
  }
  EXPECT_LE(v.n_tracked(kStd), 1100u);
  EXPECT_DOUBLE_EQ(v.counter(kStd, "keep"), 100.0);
  v.on_request_added(kStd, "t5");
  EXPECT_DOUBLE_EQ(v.counter(kStd, "t5"), 100.0);
}

}  // namespace
}  // namespace metro::sched
