// The embeddings batching window wired to a submit function: what is held together is
// submitted together (one call per engine), results reach each holder in order, cancelled
// items never run, nothing is dropped at shutdown. Simulated clock via poll(), and one run
// on the batcher's own thread.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "gateway/embed_batcher.h"

namespace metro::gateway {
namespace {

using engine::Handle;
using engine::Request;
constexpr int64_t kMs = 1'000'000;

// A stand-in engine: records each submission's prompts; a prompt starting with -1 is refused.
struct FakeEngine {
  std::mutex mu;
  std::vector<std::vector<int32_t>> calls;  // first prompt token of each request, per submission
  uint64_t next_id = 1;
  EmbedBatcher::Submit submit() {
    return [this](std::vector<Request> rs) {
      std::lock_guard<std::mutex> lock(mu);
      std::vector<Expected<Handle>> out;
      calls.emplace_back();
      for (const Request& r : rs) {
        calls.back().push_back(r.prompt.front());
        if (r.prompt.front() < 0) {
          out.emplace_back(invalid_argument("refused"));
        } else {
          out.emplace_back(Handle{next_id++, nullptr});
        }
      }
      return out;
    };
  }
};

Request req(int32_t first) {
  Request r;
  r.kind = engine::RequestKind::kEmbed;
  r.prompt = {first, 7, 7};
  return r;
}

std::vector<Request> reqs(std::initializer_list<int32_t> firsts) {
  std::vector<Request> v;
  for (int32_t f : firsts) v.push_back(req(f));
  return v;
}

// What one holder got back: ok ids, or -1 per refused request.
struct Got {
  int calls = 0;
  std::vector<int64_t> ids;
  EmbedBatcher::Done done() {
    return [this](std::vector<Expected<Handle>> hs) {
      ++calls;
      for (const auto& h : hs) ids.push_back(h.ok() ? static_cast<int64_t>(h->id) : -1);
    };
  }
};

BatchWindowConfig cfg_with(std::array<int, 3> max_batch) {
  BatchWindowConfig c;
  c.max_batch = max_batch;
  return c;
}

TEST(EmbedBatcher, HeldTogetherSubmittedTogetherInOrder) {
  FakeEngine e;
  SlaConfig sla;
  EmbedBatcher b(cfg_with({16, 32, 64}), sla, /*own_thread=*/false);
  Got g1, g2, g3;
  b.hold(reinterpret_cast<uintptr_t>(&e), SlaClass::kStandard, 6, e.submit(), reqs({1, 2}), g1.done(), 0);
  b.hold(reinterpret_cast<uintptr_t>(&e), SlaClass::kStandard, 3, e.submit(), reqs({-1}), g2.done(), 10 * kMs);
  b.hold(reinterpret_cast<uintptr_t>(&e), SlaClass::kBatch, 3, e.submit(), reqs({3}), g3.done(), 20 * kMs);
  EXPECT_EQ(b.poll(50 * kMs), 0);  // standard waits 100 ms (5% of its 2 s objective)
  EXPECT_TRUE(e.calls.empty());
  EXPECT_EQ(b.poll(100 * kMs), 1);  // the oldest standard item's wait is up; batch rides along
  ASSERT_EQ(e.calls.size(), 1u);
  EXPECT_EQ(e.calls[0], (std::vector<int32_t>{1, 2, -1, 3}));
  EXPECT_EQ(g1.calls, 1);
  EXPECT_EQ(g1.ids, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(g2.ids, (std::vector<int64_t>{-1}));  // refused in its own slot
  EXPECT_EQ(g3.ids, (std::vector<int64_t>{3}));
  const EmbedBatcherStats s = b.stats();
  EXPECT_EQ(s.held, 3u);
  EXPECT_EQ(s.batches, 1u);
  EXPECT_EQ(s.submitted, 4u);
  EXPECT_EQ(s.waiting, 0u);
}

TEST(EmbedBatcher, FullClassGoesAtOnceOneCallPerEngine) {
  FakeEngine e1, e2;
  SlaConfig sla;
  EmbedBatcher b(cfg_with({2, 32, 64}), sla, /*own_thread=*/false);
  Got g1, g2, g3;
  b.hold(reinterpret_cast<uintptr_t>(&e1), SlaClass::kRealtime, 3, e1.submit(), reqs({1}), g1.done(), 0);
  EXPECT_EQ(b.poll(1 * kMs), 0);
  b.hold(reinterpret_cast<uintptr_t>(&e2), SlaClass::kRealtime, 3, e2.submit(), reqs({2}), g2.done(), 1 * kMs);
  b.hold(reinterpret_cast<uintptr_t>(&e1), SlaClass::kRealtime, 3, e1.submit(), reqs({3}), g3.done(), 1 * kMs);
  EXPECT_EQ(b.poll(1 * kMs), 1);  // realtime holds 2 of 2: due before its 25 ms
  ASSERT_EQ(e1.calls.size(), 1u);
  ASSERT_EQ(e2.calls.size(), 1u);
  EXPECT_EQ(e1.calls[0], (std::vector<int32_t>{1}));
  EXPECT_EQ(e2.calls[0], (std::vector<int32_t>{2}));
  EXPECT_EQ(b.stats().batches, 2u);  // one submission per engine
  EXPECT_EQ(g3.calls, 0);            // the third waits for the next batch
  EXPECT_EQ(b.poll(26 * kMs), 1);
  EXPECT_EQ(e1.calls.size(), 2u);
  EXPECT_EQ(g3.calls, 1);
}

TEST(EmbedBatcher, CancelledNeverRunsAndShutdownDropsNothing) {
  FakeEngine e;
  SlaConfig sla;
  Got g1, g2;
  {
    EmbedBatcher b(cfg_with({16, 32, 64}), sla, /*own_thread=*/false);
    const uint64_t t1 = b.hold(reinterpret_cast<uintptr_t>(&e), SlaClass::kBatch, 3, e.submit(), reqs({1}), g1.done(), 0);
    b.hold(reinterpret_cast<uintptr_t>(&e), SlaClass::kBatch, 3, e.submit(), reqs({2}), g2.done(), 0);
    EXPECT_TRUE(b.cancel(t1));
    EXPECT_FALSE(b.cancel(t1));
    EXPECT_EQ(b.stats().cancelled, 1u);
    EXPECT_EQ(b.stats().waiting, 1u);
  }  // destroyed long before batch's 500 ms: what is held is submitted, not lost
  EXPECT_EQ(g1.calls, 0);
  EXPECT_EQ(g2.calls, 1);
  ASSERT_EQ(e.calls.size(), 1u);
  EXPECT_EQ(e.calls[0], (std::vector<int32_t>{2}));
  // After stop() (a server shutting down) nothing waits: a hold is submitted at once.
  EmbedBatcher b(cfg_with({16, 32, 64}), sla, /*own_thread=*/false);
  Got g3;
  b.stop();
  EXPECT_EQ(b.hold(reinterpret_cast<uintptr_t>(&e), SlaClass::kBatch, 3, e.submit(), reqs({3}), g3.done(), 0), 0u);
  EXPECT_EQ(g3.ids, (std::vector<int64_t>{2}));
  EXPECT_EQ(e.calls.size(), 2u);
}

TEST(EmbedBatcher, OwnThreadSubmitsWhenAClassFills) {
  FakeEngine e;
  SlaConfig sla;
  sla.of(SlaClass::kStandard).ttft_s = 600.0;
  BatchWindowConfig cfg = cfg_with({2, 2, 2});
  cfg.wait_fraction = 1.0;
  cfg.max_wait_cap_s = 300.0;  // only the size trigger can fire within the test
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  auto on_done = [&](std::vector<Expected<Handle>>) {
    std::lock_guard<std::mutex> lock(mu);
    ++done;
    cv.notify_all();
  };
  EmbedBatcher b(cfg, sla);  // after what its callbacks use: destroyed first
  ASSERT_DOUBLE_EQ(b.max_wait_s(SlaClass::kStandard), 300.0);
  b.hold(reinterpret_cast<uintptr_t>(&e), SlaClass::kStandard, 3, e.submit(), reqs({1}), on_done);
  b.hold(reinterpret_cast<uintptr_t>(&e), SlaClass::kStandard, 3, e.submit(), reqs({2}), on_done);
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return done == 2; }));
  std::lock_guard<std::mutex> elock(e.mu);
  ASSERT_EQ(e.calls.size(), 1u);
  EXPECT_EQ(e.calls[0], (std::vector<int32_t>{1, 2}));
}

}  // namespace
}  // namespace metro::gateway
