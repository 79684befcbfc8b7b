// x-request-id: the client's usable id kept, anything else replaced by a fresh one; W3C
// traceparent read as the spec says (malformed headers ignored).
#include "server/request_id.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace metro::server {
namespace {

TEST(RequestId, KeepsAUsableIdAndMakesOneOtherwise) {
  EXPECT_EQ(request_id_for("abc-123_X.y:z/+=@"), "abc-123_X.y:z/+=@");
  EXPECT_EQ(request_id_for(std::string(128, 'a')), std::string(128, 'a'));
  std::set<std::string> made;
  for (const std::string& bad : {std::string(), std::string(129, 'a'), std::string("has space"),
                                std::string("new\r\nline"), std::string("quote\""), std::string("\xc3\xa9")}) {
    const std::string id = request_id_for(bad);
    EXPECT_EQ(id.rfind("req_", 0), 0u) << bad;
    EXPECT_EQ(id.size(), 28u);
    made.insert(id);
  }
  EXPECT_EQ(made.size(), 6u);  // fresh every time
}

TEST(RequestId, TraceparentAsTheSpecReadsIt) {
  auto t = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(t->parent_id, "00f067aa0ba902b7");
  EXPECT_TRUE(t->sampled);
  auto later = parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-extra");
  ASSERT_TRUE(later.has_value());
  EXPECT_FALSE(later->sampled);
  for (const char* bad : {"", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                          "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  // upper case
                          "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  // zero trace
                          "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  // zero parent
                          "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // version ff
                          "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",  // 00 has no more
                          "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                          "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01"}) {
    EXPECT_FALSE(parse_traceparent(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace metro::server
