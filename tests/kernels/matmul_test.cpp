// matmul against the scalar references, for every kernel table the CPU runs.
//
// Tolerances:
//  - against vec_dot_ref on the same quantized acts: the kernels compute each block's
//    integer sum exactly and only round when they combine blocks in float, a few roundings
//    per block term plus one per addition: |y - ref| <= (n_terms + 8) * 2^-24 * magnitude,
//    where magnitude (vec_dot_magnitude_ref) is the sum of the terms' absolute values and
//    n_terms is k / block size (k for the float formats). We allow twice that.
//  - against matmul_ref on the unquantized acts: in addition, each act block's
//    quantization error, at most roundtrip_error_bound(partner) * (block max |x|), times
//    the sum of |w| over that block.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>

#include "base/aligned.h"
#include "base/fp16.h"
#include "base/thread_pool.h"
#include "kernels/kernel_table.h"
#include "kernels/kernel_test_util.h"
#include "kernels/matmul.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_ref.h"

namespace metro::kernels {
namespace {

using testing::Dist;

std::vector<const KernelTable*> tables() {
  std::vector<const KernelTable*> v{&scalar_kernels()};
  if (avx2_kernels()) v.push_back(avx2_kernels());
  return v;
}

struct Problem {
  DType type;
  int64_t n, k, m;
  std::vector<float> wf;  // n x k weights before quantization
  std::vector<float> x;   // m x k acts
  std::vector<uint8_t> w; // n rows of the quantized weights
};

Problem make_problem(DType t, int64_t n, int64_t k, int64_t m, uint32_t seed) {
  Problem p{t, n, k, m, {}, {}, {}};
  p.wf = testing::make_data(Dist::kNormal, n * k, seed);
  // Outlier rows and sign-skewed rows exercise the scale and min paths.
  for (int64_t j = 0; j < n; j += 3) {
    for (int64_t c = 0; c < k; ++c) p.wf[j * k + c] = std::fabs(p.wf[j * k + c]) * (j % 2 ? 1.0f : 0.3f);
  }
  p.x = testing::make_data(seed % 2 ? Dist::kOutliers : Dist::kNormal, m * k, seed + 1);
  p.w = testing::quantize(t, p.wf);
  return p;
}

struct Result {
  std::vector<float> y;
  std::shared_ptr<AlignedBuffer<uint8_t>> acts;
  QuantizedActs qa;
  size_t acts_bytes = 0;
  bool same_acts(const Result& o) const {
    return acts_bytes == o.acts_bytes && std::memcmp(acts->data(), o.acts->data(), acts_bytes) == 0;
  }
};

// quantize_acts + matmul with nth threads' shares run one after the other; with `claim`,
// through a shared work counter (the first caller claims everything).
Result run(const KernelTable& kt, const Weight& w, const Problem& p, int nth, bool claim = false) {
  Result r;
  r.acts_bytes = quantized_acts_bytes(p.type, p.m, p.k);
  r.acts = std::make_shared<AlignedBuffer<uint8_t>>(r.acts_bytes);
  uint8_t* buf = r.acts->data();
  for (int ith = 0; ith < nth; ++ith) {
    r.qa = quantize_acts_with(kt, p.type, p.x.data(), p.m, p.k, static_cast<size_t>(p.k), buf, ith, nth);
  }
  const size_t y_stride = static_cast<size_t>(p.n + 3);  // not the row count: strides matter
  r.y.assign(static_cast<size_t>(p.m) * y_stride, -1.0f);
  std::atomic<int64_t> next{0};
  for (int ith = 0; ith < nth; ++ith) {
    matmul_with(kt, w, r.qa, r.y.data(), y_stride, ith, nth, claim ? &next : nullptr);
  }
  return r;
}

void check_against_refs(const Problem& p, const Result& r, const std::string& what) {
  const size_t y_stride = static_cast<size_t>(p.n + 3);
  const DType partner = traits(p.type).dot_partner;
  const int64_t bs = traits(partner).block_size;
  const double n_terms = static_cast<double>(partner == DType::kF32 ? p.k : p.k / bs);
  std::vector<float> yref(static_cast<size_t>(p.m * p.n));
  const Weight wrow = make_weight_with(scalar_kernels(), p.type, p.w.data(), p.n, p.k, false);
  matmul_ref(wrow, p.x.data(), p.m, static_cast<size_t>(p.k), yref.data(), static_cast<size_t>(p.n));
  const auto wdeq = testing::dequantize(p.type, p.w, p.n * p.k);
  const size_t wrow_bytes = row_bytes(p.type, p.k);
  for (int64_t i = 0; i < p.m; ++i) {
    const uint8_t* a = r.qa.data + static_cast<size_t>(i) * r.qa.row_stride;
    for (int64_t j = 0; j < p.n; ++j) {
      const float got = r.y[static_cast<size_t>(i) * y_stride + static_cast<size_t>(j)];
      const uint8_t* wj = p.w.data() + static_cast<size_t>(j) * wrow_bytes;
      const double ref = vec_dot_ref(p.type, wj, a, p.k);
      const double mag = vec_dot_magnitude_ref(p.type, wj, a, p.k);
      ASSERT_NEAR(got, ref, 2 * (n_terms + 8) * 0x1p-24 * mag + 1e-30)
          << what << " vs vec_dot_ref at act " << i << " row " << j;
      // Against the float reference: the act quantization error, block by block.
      double qerr = 0.0, abs_wx = 0.0;
      for (int64_t b0 = 0; b0 < p.k; b0 += bs) {
        double amax = 0.0, wsum = 0.0;
        for (int64_t c = b0; c < b0 + bs; ++c) {
          amax = std::max(amax, std::fabs(static_cast<double>(p.x[i * p.k + c])));
          wsum += std::fabs(static_cast<double>(wdeq[j * p.k + c]));
          abs_wx += std::fabs(static_cast<double>(wdeq[j * p.k + c]) * p.x[i * p.k + c]);
        }
        qerr += roundtrip_error_bound(partner) * amax * wsum;
      }
      const double tol = qerr + 2 * (n_terms + 8) * 0x1p-24 * (mag + abs_wx) + 1e-30;
      ASSERT_NEAR(got, yref[static_cast<size_t>(i * p.n + j)], tol)
          << what << " vs matmul_ref at act " << i << " row " << j;
    }
    // Columns past n are not written.
    for (size_t j = static_cast<size_t>(p.n); j < y_stride; ++j) ASSERT_EQ(r.y[static_cast<size_t>(i) * y_stride + j], -1.0f);
  }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Shape {
  int64_t n, k, m;
};

std::vector<Shape> shapes_for(DType t) {
  if (traits(t).dot_partner == DType::kQ8_K) {
    return {{1, 256, 1}, {9, 512, 3}, {17, 256, 5}, {13, 4096, 2}, {24, 768, 70}};
  }
  std::vector<Shape> v = {{1, 32, 1}, {7, 64, 1}, {8, 96, 2}, {13, 288, 3}, {17, 32, 4}, {37, 160, 5},
                          {20, 4096, 1}, {9, 576, 17}, {40, 224, 70}, {3, 1536, 9}};
  if (!traits(t).quantized) {  // any k: tails shorter than a SIMD register
    v.push_back({5, 37, 3});
    v.push_back({9, 7, 1});
    v.push_back({11, 1, 6});
  }
  return v;
}

class MatmulPerType : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulPerType, EveryTableAndShapeMatchesReferences) {
  const DType t = GetParam();
  for (const KernelTable* kt : tables()) {
    uint32_t seed = 1;
    for (const Shape& s : shapes_for(t)) {
      const Problem p = make_problem(t, s.n, s.k, s.m, seed++);
      for (bool repack : {false, true}) {
        const Weight w = make_weight_with(*kt, t, p.w.data(), p.n, p.k, repack);
        const std::string what = std::string(kt->isa) + " " + w.describe() + " n=" + std::to_string(s.n) +
                                 " k=" + std::to_string(s.k) + " m=" + std::to_string(s.m);
        const Result r1 = run(*kt, w, p, 1);
        check_against_refs(p, r1, what);
        if (HasFatalFailure()) return;
        for (int nth : {2, 3}) {
          const Result rn = run(*kt, w, p, nth);
          ASSERT_TRUE(same_bits(r1.y, rn.y)) << what << " nth=" << nth;
          ASSERT_TRUE(r1.same_acts(rn)) << what << " quantize_acts nth=" << nth;
          ASSERT_TRUE(same_bits(r1.y, run(*kt, w, p, nth, true).y)) << what << " claimed, nth=" << nth;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, MatmulPerType, ::testing::ValuesIn(testing::weight_types()),
                         [](const ::testing::TestParamInfo<DType>& p) { return std::string(dtype_name(p.param)); });

// Repacked and row-major weights give the same bits, and a row of a batch gives the same
// bits as that row alone: results never depend on layout or batch composition.
TEST(Matmul, LayoutAndBatchInvariant) {
  for (const KernelTable* kt : tables()) {
    for (DType t : testing::weight_types()) {
      const int64_t k = traits(t).dot_partner == DType::kQ8_K ? 512 : 192;
      const Problem p = make_problem(t, 21, k, 11, 77);
      const Weight wr = make_weight_with(*kt, t, p.w.data(), p.n, p.k, false);
      const Weight wx = make_weight_with(*kt, t, p.w.data(), p.n, p.k, true);
      const Result a = run(*kt, wr, p, 1);
      const Result b = run(*kt, wx, p, 2);
      ASSERT_TRUE(same_bits(a.y, b.y)) << kt->isa << " " << dtype_name(t);
      for (int64_t i : {0, 5, 10}) {
        Problem single = p;
        single.m = 1;
        single.x.assign(p.x.begin() + i * k, p.x.begin() + (i + 1) * k);
        const Result s = run(*kt, wx, single, 1);
        for (int64_t j = 0; j < p.n; ++j) {
          ASSERT_EQ(s.y[static_cast<size_t>(j)], a.y[static_cast<size_t>(i * (p.n + 3) + j)])
              << kt->isa << " " << dtype_name(t) << " act " << i << " row " << j;
        }
      }
    }
  }
}

// The reference reads every x8 layout (the 32-block formats repacked by the scalar
// table, the K-quants by the AVX2 one, which alone has their x8 kernels).
TEST(Matmul, RefReadsRepackedWeights) {
  std::vector<std::pair<DType, const KernelTable*>> cases;
  for (DType t : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0}) cases.emplace_back(t, &scalar_kernels());
  if (avx2_kernels() != nullptr) {
    for (DType t : {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) cases.emplace_back(t, avx2_kernels());
  }
  for (const auto& [t, kt] : cases) {
    const int64_t k = traits(t).dot_partner == DType::kQ8_K ? 512 : 96;
    const Problem p = make_problem(t, 13, k, 3, 5);
    const Weight wr = make_weight_with(*kt, t, p.w.data(), p.n, p.k, false);
    const Weight wx = make_weight_with(*kt, t, p.w.data(), p.n, p.k, true);
    ASSERT_EQ(wx.layout, kLayoutX8) << dtype_name(t);
    std::vector<float> a(static_cast<size_t>(p.m * p.n)), b(a.size());
    matmul_ref(wr, p.x.data(), p.m, static_cast<size_t>(p.k), a.data(), static_cast<size_t>(p.n));
    matmul_ref(wx, p.x.data(), p.m, static_cast<size_t>(p.k), b.data(), static_cast<size_t>(p.n));
    EXPECT_TRUE(same_bits(a, b)) << dtype_name(t);
  }
}

// K-quant blocks of random bytes (every scale, min, quant and high-bit pattern, scales
// of both signs) with finite d and dmin: the x8 kernels give the row-major kernels' bits
// and stay within the references' bounds.
TEST(Matmul, KQuantX8OnRandomBlockBytes) {
  const KernelTable* kt = avx2_kernels();
  if (kt == nullptr) GTEST_SKIP() << "no AVX2";
  struct Fields {
    DType t;
    size_t d, dmin;  // byte offsets in the block; dmin == d: none
  };
  const Fields cases[] = {{DType::kQ2_K, offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)},
                          {DType::kQ3_K, offsetof(BlockQ3_K, d), offsetof(BlockQ3_K, d)},
                          {DType::kQ4_K, offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)},
                          {DType::kQ5_K, offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)},
                          {DType::kQ6_K, offsetof(BlockQ6_K, d), offsetof(BlockQ6_K, d)}};
  std::mt19937 rng(123);
  for (const Fields& f : cases) {
    for (const Shape& s : std::vector<Shape>{{19, 768, 1}, {9, 256, 2}, {24, 512, 7}, {13, 512, 19}}) {
      Problem p{f.t, s.n, s.k, s.m, {}, testing::make_data(Dist::kOutliers, s.m * s.k, 9), {}};
      p.w.resize(row_bytes(f.t, s.k) * static_cast<size_t>(s.n));
      for (uint8_t& b : p.w) b = static_cast<uint8_t>(rng());
      const size_t block = traits(f.t).bytes_per_block;
      std::uniform_real_distribution<float> scale(0.001f, 0.05f);
      for (size_t off = 0; off < p.w.size(); off += block) {
        const uint16_t d = fp32_to_fp16(scale(rng)), dmin = fp32_to_fp16(scale(rng));
        std::memcpy(&p.w[off + f.d], &d, 2);
        if (f.dmin != f.d) std::memcpy(&p.w[off + f.dmin], &dmin, 2);
      }
      const Weight wr = make_weight_with(*kt, f.t, p.w.data(), p.n, p.k, false);
      const Weight wx = make_weight_with(*kt, f.t, p.w.data(), p.n, p.k, true);
      ASSERT_EQ(wx.layout, kLayoutX8) << dtype_name(f.t);
      const std::string what = std::string(dtype_name(f.t)) + " random bytes n=" + std::to_string(s.n) +
                               " m=" + std::to_string(s.m);
      const Result a = run(*kt, wr, p, 1);
      const Result b = run(*kt, wx, p, 2);
      ASSERT_TRUE(same_bits(a.y, b.y)) << what;
      check_against_refs(p, b, what);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(Matmul, DescribeSaysLayout) {
  const Problem p = make_problem(DType::kQ4_1, 16, 64, 1, 3);
  EXPECT_EQ(make_weight(DType::kQ4_1, p.w.data(), 16, 64, false).describe(), "Q4_1 row-major");
  const Weight w = make_weight(DType::kQ4_1, p.w.data(), 16, 64, true);
  if (w.layout != kLayoutRowMajor) {
    EXPECT_EQ(w.describe(), "Q4_1 x8 interleaved");
  }
}

// Every table's act quantizers give the reference's bytes (ties included: the "halves"
// rows land exactly on .5 after scaling).
TEST(QuantizeActs, EveryTableMatchesReferenceBytes) {
  std::vector<float> halves(512);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = i % 32 == 0 ? 127.0f : static_cast<float>(i % 32) - 15.5f;
  for (const KernelTable* kt : tables()) {
    for (DType p : {DType::kQ8_0, DType::kQ8_1, DType::kQ8_K}) {
      for (int d = 0; d <= static_cast<int>(std::size(testing::kAllDists)); ++d) {
        const std::vector<float> x = d < static_cast<int>(std::size(testing::kAllDists))
                                         ? testing::make_data(testing::kAllDists[d], 512, 31u + static_cast<uint32_t>(d))
                                         : halves;
        std::vector<uint8_t> got(row_bytes(p, 512)), want(row_bytes(p, 512));
        std::vector<float> side_d(16, -1.0f), side_s(16, -1.0f);
        std::vector<int32_t> sums(16, -1);
        ActSide side{side_d.data(), p == DType::kQ8_1 ? side_s.data() : nullptr,
                     p == DType::kQ8_0 ? sums.data() : nullptr};
        kt->quantize_row[static_cast<int>(p)](x.data(), got.data(), 512, side);
        quantize_row_ref(p, x.data(), want.data(), 512);
        ASSERT_EQ(got, want) << kt->isa << " " << dtype_name(p) << " data " << d;
        if (p == DType::kQ8_K) continue;
        for (int b = 0; b < 16; ++b) {  // the side data describes the blocks written
          const uint8_t* blk = want.data() + b * traits(p).bytes_per_block;
          uint16_t dh, sh;
          std::memcpy(&dh, blk, 2);
          std::memcpy(&sh, blk + 2, 2);
          EXPECT_EQ(side_d[static_cast<size_t>(b)], fp16_to_fp32(dh));
          if (p == DType::kQ8_1) {
            EXPECT_EQ(side_s[static_cast<size_t>(b)], fp16_to_fp32(sh));
          }
          if (p == DType::kQ8_0) {
            int32_t sum = 0;
            for (int i = 0; i < 32; ++i) sum += static_cast<int8_t>(blk[2 + i]);
            EXPECT_EQ(sums[static_cast<size_t>(b)], sum);
          }
        }
      }
    }
  }
}

// The public entry points inside a real pool: quantize, barrier, multiply.
TEST(Matmul, RunsInsideThreadPool) {
  ThreadPool pool(2);
  const Problem p = make_problem(DType::kQ4_1, 576, 576, 5, 11);
  const Weight w = make_weight(DType::kQ4_1, p.w.data(), p.n, p.k, true);
  AlignedBuffer<uint8_t> acts(quantized_acts_bytes(p.type, p.m, p.k));
  std::vector<float> y(static_cast<size_t>(p.m * p.n));
  pool.run([&](int ith, int nth) {
    const QuantizedActs qa = quantize_acts(p.type, p.x.data(), p.m, p.k, static_cast<size_t>(p.k), acts.data(), ith, nth);
    pool.barrier();
    matmul(w, qa, y.data(), static_cast<size_t>(p.n), ith, nth);
  });
  const Result r1 = run(active_kernels(), w, p, 1);
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      ASSERT_EQ(y[static_cast<size_t>(i * p.n + j)], r1.y[static_cast<size_t>(i * (p.n + 3) + j)]);
    }
  }
}

// Claimed work inside a real pool: however the threads interleave their claims (one of
// them slowed down here), every element is computed once and the bits are the static
// split's. m 40 is one chunk of acts (GEMV-style tiles), m 300 several (GEMM-style).
TEST(Matmul, ClaimedWorkMatchesStaticSplitInsideThreadPool) {
  ThreadPool pool(3);
  for (int64_t m : {1, 40, 300}) {
    const Problem p = make_problem(DType::kQ4_1, 1536, 576, m, 13);
    const Weight w = make_weight(DType::kQ4_1, p.w.data(), p.n, p.k, true);
    const Result r1 = run(active_kernels(), w, p, 1);
    AlignedBuffer<uint8_t> acts(quantized_acts_bytes(p.type, p.m, p.k));
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<float> y(static_cast<size_t>(p.m * (p.n + 3)), -1.0f);
      std::atomic<int64_t> next{0};
      pool.run([&](int ith, int nth) {
        const QuantizedActs qa =
            quantize_acts(p.type, p.x.data(), p.m, p.k, static_cast<size_t>(p.k), acts.data(), ith, nth);
        pool.barrier();
        if (ith == rep % nth) std::this_thread::sleep_for(std::chrono::microseconds(50 * (rep % 4)));
        matmul(w, qa, y.data(), static_cast<size_t>(p.n + 3), ith, nth, &next);
      });
      ASSERT_TRUE(same_bits(r1.y, y)) << "m=" << m << " rep " << rep;
    }
  }
}

}  // namespace
}  // namespace metro::kernels
