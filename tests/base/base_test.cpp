#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <limits>
#include <vector>

#include "base/aligned.h"
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

TEST(AlignedBuffer, LargeBuffersStartOnAHugePageAndAreZeroed) {
  AlignedBuffer<float> small(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % kCacheLine, 0u);
  AlignedBuffer<uint8_t> big(kHugePage + 1);  // rounds up to two 2 MiB pages
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % kHugePage, 0u);
  EXPECT_EQ(big.size(), kHugePage + 1);
  EXPECT_TRUE(std::all_of(big.data(), big.data() + big.size(), [](uint8_t b) { return b == 0; }));
  big[kHugePage] = 7;  // the last element is inside the allocation (ASan would object)
  EXPECT_EQ(big[kHugePage], 7);
}

TEST(BumpArena, CarvesAlignedDisjointRangesAndGivesBigOnesTheirOwnChunk) {
  BumpArena arena(size_t{1} << 20);
  struct Range {
    uint8_t* p;
    size_t n;
  };
  std::vector<Range> got;
  for (size_t n : {size_t{1}, size_t{100}, size_t{4096}, size_t{300000}, size_t{2} << 20, size_t{65},
                   size_t{700000}, size_t{700000}}) {
    uint8_t* p = arena.take(n);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kCacheLine, 0u) << n;
    std::memset(p, static_cast<int>(got.size() + 1), n);  // writable over its whole length
    got.push_back({p, n});
  }
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].p[got[i].n - 1], static_cast<uint8_t>(i + 1)) << "range " << i << " was overwritten";
    for (size_t j = i + 1; j < got.size(); ++j) {
      const bool apart = got[i].p + got[i].n <= got[j].p || got[j].p + got[j].n <= got[i].p;
      EXPECT_TRUE(apart) << i << " and " << j << " overlap";
    }
  }
  // The 2 MiB request did not close the open chunk: the 65 bytes after it follow the 4 KiB
  // and 300000-byte ranges in the same chunk.
  EXPECT_EQ(got[5].p, got[3].p + round_up(300000, kCacheLine));
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
