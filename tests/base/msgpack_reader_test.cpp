#include "base/msgpack_reader.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "base/msgpack.h"

namespace metro {
namespace {

// Every shape the writer makes reads back with its value.
TEST(MsgpackReader, ReadsWhatTheWriterWrites) {
  MsgpackWriter w;
  w.map(3);
  w.str("ints");
  const int64_t ints[] = {0, 1, 127, 128, 255, 256, 65535, 65536, -1, -32, -33, -128, -129, -32768, -32769,
                          std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  w.array(std::size(ints) + 1);
  for (int64_t v : ints) w.integer(v);
  w.uint(std::numeric_limits<uint64_t>::max());
  w.str(std::string(300, 'x'));  // a str16 key
  w.array(3);
  w.nil();
  w.boolean(true);
  w.float64(-2.5);
  w.str("empty");
  w.array(0);
  auto v = parse_msgpack(w.bytes());
  ASSERT_TRUE(v.ok()) << v.status().message();
  ASSERT_TRUE(v->is_map());
  const MsgpackValue* a = v->get("ints");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items.size(), std::size(ints) + 1);
  for (size_t k = 0; k < std::size(ints); ++k) EXPECT_EQ(a->items[k].as_int(), ints[k]) << k;
  EXPECT_EQ(a->items.back().as_uint(), std::numeric_limits<uint64_t>::max());
  EXPECT_FALSE(a->items.back().as_int().has_value());
  EXPECT_FALSE(a->items[8].as_uint().has_value());  // -1
  const MsgpackValue* mixed = v->get(std::string(300, 'x'));
  ASSERT_NE(mixed, nullptr);
  ASSERT_EQ(mixed->items.size(), 3u);
  EXPECT_TRUE(mixed->items[0].is_nil());
  EXPECT_TRUE(mixed->items[1].b);
  EXPECT_EQ(mixed->items[2].f, -2.5);
  EXPECT_TRUE(v->get("empty")->items.empty());
  EXPECT_EQ(v->get("absent"), nullptr);
}

// Every proper prefix of a message is refused, as are trailing bytes, the unused byte
// 0xc1, nesting past the depth and counts the bytes left cannot hold.
TEST(MsgpackReader, RefusesWhatIsNotOneWholeMessage) {
  MsgpackWriter w;
  w.array(2);
  w.str("BlockStored");
  w.map(1);
  w.str("k");
  w.uint(1ull << 40);
  const std::string& b = w.bytes();
  for (size_t n = 0; n < b.size(); ++n) EXPECT_FALSE(parse_msgpack(b.substr(0, n)).ok()) << n;
  EXPECT_FALSE(parse_msgpack(b + '\0').ok());
  EXPECT_FALSE(parse_msgpack(std::string("\xc1", 1)).ok());
  EXPECT_FALSE(parse_msgpack(std::string(40, '\x91') + '\x01').ok());  // 40 nested arrays
  EXPECT_TRUE(parse_msgpack(std::string(20, '\x91') + '\x01').ok());
  EXPECT_FALSE(parse_msgpack(std::string("\xdd\xff\xff\xff\xff\x01", 6)).ok());  // array32 of 4G items
  EXPECT_FALSE(parse_msgpack(std::string("\xdb\x00\x00\x10\x00" "abc", 8)).ok());  // str32 past the end
}

}  // namespace
}  // namespace metro
