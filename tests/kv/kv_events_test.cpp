// The prefix cache's event log (kv/kv_events.h) and its MessagePack encoding in vLLM's
// layouts (server/kv_events_publisher.h): what the block pool registers and drops, joined
// into chains, and the bytes a subscriber decodes.
#include "kv/kv_events.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "base/msgpack.h"
#include "kv/block_pool.h"
#include "server/kv_events_publisher.h"

namespace metro::kv {
namespace {

std::vector<int32_t> block_tokens(int32_t first, int n = 4) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(KvEvents, ThePoolLogsChainsOfStoresAndRunsOfRemovals) {
  KvBlockPool pool(3, 4);
  KvEventLog log;
  pool.set_event_log(&log);
  const BlockId a = *pool.allocate(), b = *pool.allocate(), c = *pool.allocate();
  pool.set_hash(a, 101, 7, block_tokens(0));     // a root: 7 is no cached block
  pool.set_hash(b, 102, 101, block_tokens(4));   // a's child: joins its event
  pool.set_hash(c, 201, 555, block_tokens(8));   // another chain
  pool.set_hash(c, 202, 201, block_tokens(12));  // c already has a hash: nothing
  std::vector<KvEvent> ev = log.take();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].kind, KvEvent::Kind::kStored);
  EXPECT_EQ(ev[0].hashes, (std::vector<uint64_t>{101, 102}));
  EXPECT_FALSE(ev[0].parent.has_value());
  EXPECT_EQ(ev[0].token_ids, block_tokens(0, 8));
  EXPECT_EQ(ev[1].hashes, (std::vector<uint64_t>{201}));
  EXPECT_TRUE(log.empty());

  // Freed, the cached blocks stay until allocation reuses them: then they are removed.
  pool.unref(a);
  pool.unref(b);
  pool.unref(c);
  EXPECT_TRUE(log.empty());
  ASSERT_TRUE(pool.allocate().has_value());
  ASSERT_TRUE(pool.allocate().has_value());
  ev = log.take();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(ev[0].hashes, (std::vector<uint64_t>{101, 102}));
}

TEST(KvEvents, AStoreUnderACachedParentNamesIt) {
  KvBlockPool pool(2, 4);
  KvEventLog log;
  pool.set_event_log(&log);
  const BlockId a = *pool.allocate(), b = *pool.allocate();
  pool.set_hash(a, 11, 3, block_tokens(0));
  log.take();
  pool.set_hash(b, 12, 11, block_tokens(4));
  std::vector<KvEvent> ev = log.take();
  ASSERT_EQ(ev.size(), 1u);
  ASSERT_TRUE(ev[0].parent.has_value());
  EXPECT_EQ(*ev[0].parent, 11u);
  log.removed(12);
  log.all_cleared();  // drops what came before it
  ev = log.take();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, KvEvent::Kind::kAllCleared);
}

std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

TEST(KvEvents, MsgpackUsesTheSmallestEncodings) {
  MsgpackWriter w;
  w.uint(0);
  w.uint(127);
  w.uint(128);
  w.uint(65535);
  w.uint(65536);
  w.uint(uint64_t{1} << 32);
  w.integer(-1);
  w.integer(-33);
  w.integer(-129);
  w.nil();
  w.str("type");
  w.array(2);
  w.map(16);
  EXPECT_EQ(hex(w.bytes()),
            "00" "7f" "cc80" "cdffff" "ce00010000" "cf0000000100000000" "ff" "d0df" "d1ff7f" "c0" "a474797065" "92"
            "de0010");
  MsgpackWriter f;
  f.float64(1.5);
  EXPECT_EQ(hex(f.bytes()), "cb3ff8000000000000");
  MsgpackWriter s;
  s.str(std::string(40, 'x'));
  EXPECT_EQ(hex(s.bytes()).substr(0, 4), "d928");
}

TEST(KvEvents, BatchesEncodeInBothLayouts) {
  KvEvent st;
  st.kind = KvEvent::Kind::kStored;
  st.hashes = {5};
  st.token_ids = {1, 2};
  KvEvent rm;
  rm.kind = KvEvent::Kind::kRemoved;
  rm.hashes = {5};
  const std::vector<KvEvent> ev = {st, rm};
  // Map: {"ts": 0.5, "events": [{"type": "BlockStored", ...}, {...}], "data_parallel_rank": 0}.
  const std::string map = server::encode_kv_event_batch(ev, 0.5, 2, false);
  EXPECT_EQ(hex(map).substr(0, 30), "83a27473cb3fe0000000000000a665");
  EXPECT_NE(map.find("\xa4type\xab" "BlockStored\xac" "block_hashes\x91\x05\xb1parent_block_hash\xc0\xa9token_ids\x92\x01\x02"
                     "\xaa" "block_size\x02\xa7lora_id\xc0\xa6medium\xa3" "CPU\xa9lora_name\xc0"),
            std::string::npos)
      << hex(map);
  EXPECT_NE(map.find("\x83\xa4type\xac" "BlockRemoved\xac" "block_hashes\x91\x05\xa6medium\xa3" "CPU"), std::string::npos);
  EXPECT_EQ(hex(map.substr(map.size() - 20)), hex(std::string("\xb2" "data_parallel_rank\x00", 20)));
  // Array: [0.5, [["BlockStored", [5], nil, [1, 2], 2, nil, "CPU"], ["BlockRemoved", [5], "CPU"]], 0].
  const std::string arr = server::encode_kv_event_batch(ev, 0.5, 2, true);
  EXPECT_EQ(hex(arr), "93cb3fe0000000000000" "92" "97ab426c6f636b53746f726564" "9105" "c0" "920102" "02" "c0" "a3435055"
                      "93ac426c6f636b52656d6f766564" "9105" "a3435055" "00");
}

TEST(KvEvents, ThePublisherRefusesWhatIsNotAnEndpoint) {
  server::KvEventsConfig c;
  c.endpoint = "localhost:5557";
  auto p = server::KvEventsPublisher::start(c);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("ZeroMQ endpoint"), std::string::npos);
}

}  // namespace
}  // namespace metro::kv
