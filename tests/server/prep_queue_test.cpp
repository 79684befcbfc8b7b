// The per-tenant queue in front of parsing and tokenizing: tenants are served in turn, so
// one tenant's backlog delays another's request by at most the jobs already running; the
// queue is bounded in total and per tenant, in jobs and in bytes.
#include "server/prep_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <vector>

namespace metro::server {
namespace {

TEST(PrepQueue, TenantsAreServedInTurn) {
  PrepQueue q({.threads = 1, .max_queued = 100, .max_queued_per_tenant = 50});
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::mutex mu;
  std::vector<std::string> order;
  // The one thread is held by a first job while the backlog builds up.
  ASSERT_EQ(q.submit("flood", 0, [gate] { gate.wait(); }), PrepQueue::Submit::kQueued);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(q.submit("flood", 0, [&] { std::lock_guard l(mu); order.push_back("flood"); }), PrepQueue::Submit::kQueued);
  }
  std::promise<void> quiet_done;
  ASSERT_EQ(q.submit("quiet", 0, [&] {
              {
                std::lock_guard l(mu);
                order.push_back("quiet");
              }
              quiet_done.set_value();
            }),
            PrepQueue::Submit::kQueued);
  release.set_value();
  quiet_done.get_future().wait();
  q.drain_and_join();
  ASSERT_EQ(order.size(), 21u);
  // Behind 20 jobs of the flood, the quiet tenant's job is the second to run.
  size_t at = 0;
  while (order[at] != "quiet") ++at;
  EXPECT_LE(at, 1u);
}

TEST(PrepQueue, BoundsInTotalAndPerTenant) {
  PrepQueue q({.threads = 1, .max_queued = 5, .max_queued_per_tenant = 3, .max_queued_bytes = 1 << 20,
               .max_queued_bytes_per_tenant = 1 << 20});
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<int> ran{0};
  ASSERT_EQ(q.submit("a", 0, [gate, &ran] { gate.wait(); ++ran; }), PrepQueue::Submit::kQueued);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // running, no longer queued
  for (int i = 0; i < 3; ++i) ASSERT_EQ(q.submit("a", 0, [&] { ++ran; }), PrepQueue::Submit::kQueued);
  EXPECT_EQ(q.submit("a", 0, [&] { ++ran; }), PrepQueue::Submit::kTenantFull);
  EXPECT_EQ(q.submit("b", 0, [&] { ++ran; }), PrepQueue::Submit::kQueued);
  EXPECT_EQ(q.submit("c", 0, [&] { ++ran; }), PrepQueue::Submit::kQueued);
  EXPECT_EQ(q.submit("d", 0, [&] { ++ran; }), PrepQueue::Submit::kFull);
  EXPECT_EQ(q.queued(), 5u);
  release.set_value();
  q.drain_and_join();  // runs everything queued
  EXPECT_EQ(ran.load(), 6);
  EXPECT_EQ(q.submit("a", 0, [] {}), PrepQueue::Submit::kStopped);
}

TEST(PrepQueue, BoundsBytesInTotalAndPerTenant) {
  PrepQueue q({.threads = 1, .max_queued = 100, .max_queued_per_tenant = 100, .max_queued_bytes = 1000,
               .max_queued_bytes_per_tenant = 400});
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<int> ran{0};
  ASSERT_EQ(q.submit("a", 0, [gate, &ran] { gate.wait(); ++ran; }), PrepQueue::Submit::kQueued);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // running, no longer queued
  // Many small jobs of one tenant fit; its bytes, not its count, stop it.
  for (int i = 0; i < 40; ++i) ASSERT_EQ(q.submit("a", 10, [&] { ++ran; }), PrepQueue::Submit::kQueued);
  EXPECT_EQ(q.submit("a", 1, [&] { ++ran; }), PrepQueue::Submit::kTenantFull);
  // A body larger than the tenant's bound on its own is queued when the tenant has nothing waiting.
  EXPECT_EQ(q.submit("b", 500, [&] { ++ran; }), PrepQueue::Submit::kQueued);
  EXPECT_EQ(q.submit("b", 1, [&] { ++ran; }), PrepQueue::Submit::kTenantFull);
  EXPECT_EQ(q.submit("c", 100, [&] { ++ran; }), PrepQueue::Submit::kQueued);
  EXPECT_EQ(q.queued_bytes(), 1000u);
  EXPECT_EQ(q.submit("d", 1, [&] { ++ran; }), PrepQueue::Submit::kFull);
  release.set_value();
  q.drain_and_join();
  EXPECT_EQ(ran.load(), 43);
  EXPECT_EQ(q.queued_bytes(), 0u);
}

}  // namespace
}  // namespace metro::server
