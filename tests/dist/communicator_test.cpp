// Communicators: the group of one, and the in-process group's all-reduce (sums in rank
// order, the same bits on every rank, reusable call after call).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "dist/communicator.h"

namespace metro::dist {
namespace {

TEST(SelfCommunicator, IsARankOfOneThatLeavesDataAlone) {
  SelfCommunicator c;
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  std::vector<float> x = {1.5f, -2.0f, 3.25f};
  const std::vector<float> before = x;
  c.all_reduce_sum(x);
  c.barrier();
  EXPECT_EQ(x, before);
}

// Values of very different magnitudes, so that the order of a float sum shows in its bits.
std::vector<float> rank_data(int rank, size_t n, int round) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * round + rank));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const float scale = (i + static_cast<size_t>(rank)) % 3 == 0 ? 1e7f : 1.0f;
    v[i] = u(rng) * scale;
  }
  return v;
}

TEST(LocalGroup, SumsInRankOrderToTheSameBitsOnEveryRank) {
  for (int n_ranks : {1, 2, 3, 4}) {
    auto group = make_local_group(n_ranks);
    ASSERT_EQ(static_cast<int>(group.size()), n_ranks);
    const std::vector<size_t> sizes = {0, 1, 2, 5, 1000, 3};
    std::vector<std::vector<std::vector<float>>> got(static_cast<size_t>(n_ranks));
    std::vector<std::thread> threads;
    for (int r = 0; r < n_ranks; ++r) {
      threads.emplace_back([&, r] {
        Communicator& c = *group[static_cast<size_t>(r)];
        EXPECT_EQ(c.rank(), r);
        EXPECT_EQ(c.size(), n_ranks);
        for (size_t round = 0; round < sizes.size(); ++round) {
          std::vector<float> x = rank_data(r, sizes[round], static_cast<int>(round));
          c.all_reduce_sum(x);
          got[static_cast<size_t>(r)].push_back(std::move(x));
        }
        c.barrier();
      });
    }
    for (auto& t : threads) t.join();
    for (size_t round = 0; round < sizes.size(); ++round) {
      std::vector<float> want = rank_data(0, sizes[round], static_cast<int>(round));
      for (int r = 1; r < n_ranks; ++r) {
        const std::vector<float> v = rank_data(r, sizes[round], static_cast<int>(round));
        for (size_t i = 0; i < v.size(); ++i) want[i] += v[i];
      }
      for (int r = 0; r < n_ranks; ++r) {
        const auto& x = got[static_cast<size_t>(r)][round];
        ASSERT_EQ(x.size(), want.size());
        if (want.empty()) continue;  // memcmp must not see the null data of an empty vector
        EXPECT_EQ(0, std::memcmp(x.data(), want.data(), want.size() * sizeof(float)))
            << n_ranks << " ranks, round " << round << ", rank " << r;
      }
    }
  }
}

// The data above does tell orders apart: summed the other way round, some element differs.
TEST(LocalGroup, TheTestDataTellsSummationOrdersApart) {
  const size_t n = 1000;
  const auto a = rank_data(0, n, 4), b = rank_data(1, n, 4), c = rank_data(2, n, 4);
  int differ = 0;
  for (size_t i = 0; i < n; ++i) differ += (a[i] + b[i]) + c[i] != a[i] + (b[i] + c[i]);
  EXPECT_GT(differ, 0);
}

}  // namespace
}  // namespace metro::dist
