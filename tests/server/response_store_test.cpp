// The store of /v1/responses answers: bounded by bytes with the least recently used going
// first, and blind across tenants (another tenant's id looks exactly like a missing one).
#include "server/response_store.h"

#include <gtest/gtest.h>

#include <string>

namespace metro::server {
namespace {

nlohmann::json turn(const std::string& text) { return nlohmann::json::array({{{"role", "user"}, {"content", text}}}); }

TEST(ResponseStore, KeepsWhatFitsAndDropsTheLeastRecentlyUsed) {
  ResponseStore store(4000);
  const std::string body(900, 'x');
  for (int i = 0; i < 4; ++i) store.put("t", "resp_" + std::to_string(i), turn("q"), body);
  EXPECT_EQ(store.size(), 4u);
  EXPECT_LE(store.bytes(), 4000u);
  ASSERT_NE(store.get("t", "resp_0"), nullptr);  // now the most recently used
  store.put("t", "resp_4", turn("q"), body);     // evicts resp_1, the least recently used
  EXPECT_NE(store.get("t", "resp_0"), nullptr);
  EXPECT_EQ(store.get("t", "resp_1"), nullptr);
  EXPECT_NE(store.get("t", "resp_4"), nullptr);
  EXPECT_LE(store.bytes(), 4000u);
  // Larger than the whole bound: not kept, nothing else lost for it.
  const size_t before = store.size();
  store.put("t", "resp_big", turn("q"), std::string(5000, 'y'));
  EXPECT_EQ(store.get("t", "resp_big"), nullptr);
  EXPECT_EQ(store.size(), before);
  // Replacing an id keeps one entry and accounts its bytes once.
  store.put("t", "resp_4", turn("again"), "{}");
  EXPECT_EQ(store.get("t", "resp_4")->response_json, "{}");
  EXPECT_EQ(store.size(), before);
  ResponseStore none(0);
  none.put("t", "resp_x", turn("q"), "{}");
  EXPECT_EQ(none.size(), 0u);
}

TEST(ResponseStore, AnotherTenantFindsNothing) {
  ResponseStore store(1 << 20);
  store.put("alice", "resp_a", turn("secret"), R"({"id":"resp_a"})");
  auto mine = store.get("alice", "resp_a");
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(mine->conversation[0]["content"], "secret");
  EXPECT_EQ(store.get("bob", "resp_a"), nullptr);
  EXPECT_EQ(store.get("", "resp_a"), nullptr);
  EXPECT_FALSE(store.erase("bob", "resp_a"));
  EXPECT_NE(store.get("alice", "resp_a"), nullptr);
  EXPECT_TRUE(store.erase("alice", "resp_a"));
  EXPECT_EQ(store.get("alice", "resp_a"), nullptr);
  EXPECT_EQ(store.bytes(), 0u);
}

}  // namespace
}  // namespace metro::server
