#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "base/checked_math.h"
#include "base/cpu_features.h"
#include "base/fp16.h"
#include "base/hash.h"
#include "base/status.h"
#include "base/thread_pool.h"

namespace metro {
namespace {

Expected<int> half(int x) {
  if (x % 2) return invalid_argument("odd");
  return x / 2;
}

Status quarter(int x, int* out) {
  METRO_ASSIGN_OR_RETURN(int h, half(x));
  METRO_ASSIGN_OR_RETURN(*out, half(h));
  return {};
}

TEST(Status, ExpectedCarriesValueOrError) {
  int q = 0;
  EXPECT_TRUE(quarter(8, &q).ok());
  EXPECT_EQ(q, 2);
  Status s = quarter(6, &q);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd");
  EXPECT_EQ(s.to_string(), "invalid argument: odd");
}

TEST(CheckedMath, DetectsOverflow) {
  EXPECT_FALSE(checked_mul(1ull << 32, 1ull << 32).has_value());
  EXPECT_EQ(*checked_mul(1ull << 31, 2), 1ull << 32);
  EXPECT_FALSE(checked_add(std::numeric_limits<uint64_t>::max(), 1).has_value());
  EXPECT_FALSE(checked_align_up(std::numeric_limits<uint64_t>::max() - 3, 32).has_value());
  EXPECT_EQ(*checked_align_up(33, 32), 64u);
  EXPECT_TRUE(is_power_of_two(64));
  EXPECT_FALSE(is_power_of_two(48));
  EXPECT_FALSE(is_power_of_two(0));
}

TEST(Fp16, ExhaustiveRoundTripOfEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f))));
      continue;
    }
    ASSERT_EQ(fp32_to_fp16(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(Fp16, RoundsToNearestEven) {
  EXPECT_EQ(fp16_to_fp32(fp32_to_fp16(1.0f + 0x1p-11f)), 1.0f);  // tie -> even
  EXPECT_EQ(fp16_to_fp32(fp32_to_fp16(1.0f + 3 * 0x1p-11f)), 1.0f + 0x1p-9f);
  EXPECT_TRUE(std::isinf(fp16_to_fp32(fp32_to_fp16(70000.0f))));
  EXPECT_EQ(fp16_to_fp32(fp32_to_fp16(65504.0f)), 65504.0f);
  EXPECT_EQ(fp16_to_fp32(fp32_to_fp16(0x1p-24f)), 0x1p-24f);  // smallest subnormal
  EXPECT_EQ(fp16_to_fp32(fp32_to_fp16(0x1p-26f)), 0.0f);
  // Relative error of any normal-range float is at most 2^-11.
  for (float x = 1e-4f; x < 6e4f; x *= 1.37f) {
    float y = fp16_to_fp32(fp32_to_fp16(x));
    EXPECT_LE(std::fabs(y - x), x * 0x1p-11f) << x;
  }
}

TEST(Bf16, RoundTrip) {
  EXPECT_EQ(bf16_to_fp32(fp32_to_bf16(1.5f)), 1.5f);
  EXPECT_EQ(bf16_to_fp32(fp32_to_bf16(-2.0f)), -2.0f);
  float x = 3.14159f;
  EXPECT_LE(std::fabs(bf16_to_fp32(fp32_to_bf16(x)) - x), x * 0x1p-8f);
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(std::nanf("")))));
}

TEST(Hash, StableAndSensitive) {
  EXPECT_EQ(hash_string("abc"), hash_string("abc"));
  EXPECT_NE(hash_string("abc"), hash_string("abd"));
  EXPECT_NE(hash_string(""), hash_string(std::string_view("\0", 1)));
  EXPECT_NE(hash_combine(1, 2), hash_combine(2, 1));
}

TEST(CpuFeatures, DetectsSomething) {
  const auto& f = cpu_features();
  EXPECT_GE(f.physical_cores, 1);
  EXPECT_GE(f.logical_cpus, f.physical_cores);
#if defined(__x86_64__)
  EXPECT_TRUE(f.sse42);
#endif
}

TEST(ThreadPool, RunsEveryThreadOnceAndJoins) {
  for (int n : {1, 2, 3, 4}) {
    ThreadPool pool(n);
    for (int rep = 0; rep < 50; ++rep) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.run([&](int ith, int nth) {
        EXPECT_EQ(nth, n);
        hits[static_cast<size_t>(ith)].fetch_add(1);
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
  }
}

TEST(ThreadPool, ParallelForCoversRangeExactlyOnce) {
  ThreadPool pool(3);
  for (size_t n : {0u, 1u, 2u, 7u, 1000u}) {
    std::vector<std::atomic<int>> seen(n);
    pool.parallel_for(n, [&](size_t b, size_t e, int) {
      for (size_t i = b; i < e; ++i) seen[i].fetch_add(1);
    });
    for (auto& s : seen) ASSERT_EQ(s.load(), 1);
  }
}

TEST(ThreadPool, BarrierSeparatesPhases) {
  ThreadPool pool(4);
  std::vector<int> a(4, 0), b(4, 0);
  for (int rep = 0; rep < 100; ++rep) {
    pool.run([&](int ith, int nth) {
      a[static_cast<size_t>(ith)] = rep;
      pool.barrier();
      int sum = 0;
      for (int k = 0; k < nth; ++k) sum += a[static_cast<size_t>(k)];
      b[static_cast<size_t>(ith)] = sum;
      pool.barrier();
    });
    for (int v : b) ASSERT_EQ(v, 4 * rep);
  }
}

}  // namespace
}  // namespace metro
