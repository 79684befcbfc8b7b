#include "loadgen/sse_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace metro::loadgen {
namespace {

struct Seen {
  std::string type, data, id;
  bool operator==(const Seen&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Seen& s) {
  return os << "{" << s.type << "|" << s.data << "|" << s.id << "}";
}

std::vector<Seen> parse_in_pieces(const std::string& stream, const std::vector<size_t>& cuts) {
  SseParser p;
  std::vector<Seen> out;
  size_t prev = 0;
  auto sink = [&](const SseEvent& e) { out.push_back({e.type, e.data, e.id}); };
  for (size_t c : cuts) {
    EXPECT_TRUE(p.feed(std::string_view(stream).substr(prev, c - prev), sink).ok());
    prev = c;
  }
  EXPECT_TRUE(p.feed(std::string_view(stream).substr(prev), sink).ok());
  return out;
}

// Every feature of the format the parser must handle, in LF, CRLF and CR line endings,
// including a multi-byte UTF-8 character that a cut can split.
const std::string kStream =
    "\xEF\xBB\xBF"                                   // BOM, dropped
    ": a comment line\n"                             // ignored
    "data: {\"text\":\"caf\xC3\xA9\"}\n\n"           // plain event
    "event: update\r\ndata:no-space\r\nid: 7\r\n\r\n"  // CRLF, a type, an id, no space after ':'
    "data: line one\rdata: line two\r\r"             // CR line endings, two data lines
    "retry: 100\nunknown: x\ndata\n\n"               // field without a colon: empty data
    "event: ignored-no-data\n\n"                     // no data: not dispatched
    "data:  two leading spaces\n\n"                  // only one space is removed
    "data: [DONE]\n\n";

const std::vector<Seen> kExpected = {
    {"message", "{\"text\":\"caf\xC3\xA9\"}", ""},
    {"update", "no-space", "7"},
    {"message", "line one\nline two", "7"},  // the last event id persists
    {"message", "", "7"},
    {"message", " two leading spaces", "7"},
    {"message", "[DONE]", "7"},
};

TEST(LoadgenSseParser, WholeStream) { EXPECT_EQ(parse_in_pieces(kStream, {}), kExpected); }

TEST(LoadgenSseParser, EverySplitPoint) {
  for (size_t i = 0; i <= kStream.size(); ++i) {
    ASSERT_EQ(parse_in_pieces(kStream, {i}), kExpected) << "cut at " << i;
  }
}

TEST(LoadgenSseParser, EveryPairOfSplitPoints) {
  for (size_t i = 0; i <= kStream.size(); ++i) {
    for (size_t j = i; j <= kStream.size(); ++j) {
      ASSERT_EQ(parse_in_pieces(kStream, {i, j}), kExpected) << "cuts at " << i << ", " << j;
    }
  }
}

TEST(LoadgenSseParser, ByteAtATime) {
  std::vector<size_t> cuts;
  for (size_t i = 1; i < kStream.size(); ++i) cuts.push_back(i);
  EXPECT_EQ(parse_in_pieces(kStream, cuts), kExpected);
}

TEST(LoadgenSseParser, CrThenLfInNextFeedIsOneLineEnd) {
  // "data: a\r" | "\n\r\n": the LF after a CR that ended a feed must not count as a blank line.
  SseParser p;
  std::vector<std::string> got;
  auto sink = [&](const SseEvent& e) { got.push_back(e.data); };
  ASSERT_TRUE(p.feed("data: a\r", sink).ok());
  ASSERT_TRUE(p.feed("\n", sink).ok());
  EXPECT_TRUE(got.empty());
  ASSERT_TRUE(p.feed("data: b\r\n\r\n", sink).ok());
  EXPECT_EQ(got, std::vector<std::string>({"a\nb"}));
}

TEST(LoadgenSseParser, PartialEventAtEndIsReported) {
  SseParser p;
  int n = 0;
  ASSERT_TRUE(p.feed("data: done\n\ndata: cut", [&](const SseEvent&) { ++n; }).ok());
  EXPECT_EQ(n, 1);
  EXPECT_TRUE(p.has_partial_event());
  SseParser q;
  ASSERT_TRUE(q.feed("data: whole\n", [&](const SseEvent&) { ++n; }).ok());
  EXPECT_TRUE(q.has_partial_event());  // the field line is in, the blank line is not
  ASSERT_TRUE(q.feed("\n", [&](const SseEvent&) { ++n; }).ok());
  EXPECT_FALSE(q.has_partial_event());
  EXPECT_EQ(q.n_events(), 1u);
}

TEST(LoadgenSseParser, OverlongLineIsAnErrorNotUnboundedMemory) {
  SseParser p(64);
  auto sink = [](const SseEvent&) {};
  EXPECT_TRUE(p.feed(std::string(40, 'x'), sink).ok());
  Status s = p.feed(std::string(40, 'x'), sink);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("longer than 64"), std::string::npos) << s.message();
  SseParser q(64);
  EXPECT_FALSE(q.feed(std::string(100, 'y') + "\n", sink).ok());
}

}  // namespace
}  // namespace metro::loadgen
