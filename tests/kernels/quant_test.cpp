// The reference block formats: layouts, round-trip error bounds, reference dot products.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "base/fp16.h"
#include "kernels/kernel_test_util.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_ref.h"

namespace metro::kernels {
namespace {

using testing::Dist;

std::vector<DType> all_quantizable() {
  auto v = testing::weight_types();
  v.push_back(DType::kQ8_1);
  v.push_back(DType::kQ8_K);
  return v;
}

TEST(QuantLayout, TraitsMatchBlockStructs) {
  EXPECT_EQ(traits(DType::kQ4_0).bytes_per_block, static_cast<int>(sizeof(BlockQ4_0)));
  EXPECT_EQ(traits(DType::kQ4_1).bytes_per_block, static_cast<int>(sizeof(BlockQ4_1)));
  EXPECT_EQ(traits(DType::kQ5_0).bytes_per_block, static_cast<int>(sizeof(BlockQ5_0)));
  EXPECT_EQ(traits(DType::kQ5_1).bytes_per_block, static_cast<int>(sizeof(BlockQ5_1)));
  EXPECT_EQ(traits(DType::kQ8_0).bytes_per_block, static_cast<int>(sizeof(BlockQ8_0)));
  EXPECT_EQ(traits(DType::kQ8_1).bytes_per_block, static_cast<int>(sizeof(BlockQ8_1)));
  EXPECT_EQ(traits(DType::kQ4_K).bytes_per_block, static_cast<int>(sizeof(BlockQ4_K)));
  EXPECT_EQ(traits(DType::kQ5_K).bytes_per_block, static_cast<int>(sizeof(BlockQ5_K)));
  EXPECT_EQ(traits(DType::kQ6_K).bytes_per_block, static_cast<int>(sizeof(BlockQ6_K)));
  EXPECT_EQ(traits(DType::kQ8_K).bytes_per_block, static_cast<int>(sizeof(BlockQ8_K)));
  EXPECT_EQ(traits(DType::kQ2_K).bytes_per_block, static_cast<int>(sizeof(BlockQ2_K)));
  EXPECT_EQ(traits(DType::kQ3_K).bytes_per_block, static_cast<int>(sizeof(BlockQ3_K)));
}

// Hand-built blocks pin the element order of the nibble formats.
TEST(QuantLayout, Q4_0NibbleOrder) {
  BlockQ4_0 b;
  b.d = fp32_to_fp16(0.5f);
  for (int i = 0; i < 16; ++i) b.qs[i] = static_cast<uint8_t>(i | ((15 - i) << 4));
  float y[32];
  dequantize_row_ref(DType::kQ4_0, &b, y, 32);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(y[i], 0.5f * static_cast<float>(i - 8));
    EXPECT_EQ(y[i + 16], 0.5f * static_cast<float>(7 - i));
  }
}

TEST(QuantLayout, Q5_1HighBitOrder) {
  BlockQ5_1 b;
  b.d = fp32_to_fp16(1.0f);
  b.m = fp32_to_fp16(-3.0f);
  const uint32_t qh = 0x80000001u;  // elements 0 and 31 get the fifth bit
  std::memcpy(b.qh, &qh, 4);
  std::memset(b.qs, 0x21, 16);  // low nibble 1, high nibble 2
  float y[32];
  dequantize_row_ref(DType::kQ5_1, &b, y, 32);
  EXPECT_EQ(y[0], 17.0f - 3.0f);
  EXPECT_EQ(y[1], 1.0f - 3.0f);
  EXPECT_EQ(y[16], 2.0f - 3.0f);
  EXPECT_EQ(y[31], 18.0f - 3.0f);
}

TEST(QuantLayout, KScaleMinPackingRoundTrips) {
  for (int v = 0; v < 64; ++v) {
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = static_cast<uint8_t>((v + 7 * j) % 64);
      m[j] = static_cast<uint8_t>((63 - v + 13 * j) % 64);
    }
    uint8_t packed[12];
    pack_scale_min_k4(sc, m, packed);
    for (int j = 0; j < 8; ++j) {
      uint8_t s2, m2;
      unpack_scale_min_k4(packed, j, &s2, &m2);
      EXPECT_EQ(s2, sc[j]);
      EXPECT_EQ(m2, m[j]);
    }
  }
}

TEST(QuantLayout, Q6_KElementOrder) {
  // q = element index mod 64 with unit scales: every element must decode to its own q - 32.
  BlockQ6_K b{};
  b.d = fp32_to_fp16(1.0f);
  for (auto& s : b.scales) s = 1;
  uint8_t q[256];
  for (int e = 0; e < 256; ++e) q[e] = static_cast<uint8_t>((e * 37 + 5) % 64);
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t* qq = q + 128 * h;
      b.ql[64 * h + l] = static_cast<uint8_t>((qq[l] & 15) | ((qq[l + 64] & 15) << 4));
      b.ql[64 * h + l + 32] = static_cast<uint8_t>((qq[l + 32] & 15) | ((qq[l + 96] & 15) << 4));
      b.qh[32 * h + l] = static_cast<uint8_t>((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                                             ((qq[l + 96] >> 4) << 6));
    }
  }
  float y[256];
  dequantize_row_ref(DType::kQ6_K, &b, y, 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], static_cast<float>(q[e] - 32)) << e;
}

// Q2_K and Q3_K, built by hand from the layout: element 128h + 32s + l is bits 2s..2s+1 of
// qs[32h + l] (and, for Q3_K, bit 4h + s of hmask[l]); sub-block j has scale j.
TEST(QuantLayout, Q2_KAndQ3_KElementOrder) {
  int q[256];
  for (int e = 0; e < 256; ++e) q[e] = (e * 37 + 5) % 8;
  BlockQ2_K b2{};
  b2.d = fp32_to_fp16(1.0f);
  b2.dmin = fp32_to_fp16(0.5f);
  BlockQ3_K b3{};
  b3.d = fp32_to_fp16(1.0f);
  int sc3[16];
  for (int j = 0; j < 16; ++j) {
    b2.scales[j] = static_cast<uint8_t>((1 + j % 15) | ((j % 4) << 4));
    sc3[j] = j % 2 ? j - 32 : 31 - j;  // both ends of -32..31
  }
  for (int h = 0; h < 2; ++h) {
    for (int s4 = 0; s4 < 4; ++s4) {
      for (int l = 0; l < 32; ++l) {
        const int e = 128 * h + 32 * s4 + l;
        b2.qs[32 * h + l] = static_cast<uint8_t>(b2.qs[32 * h + l] | ((q[e] & 3) << (2 * s4)));
        b3.qs[32 * h + l] = static_cast<uint8_t>(b3.qs[32 * h + l] | ((q[e] & 3) << (2 * s4)));
        b3.hmask[l] = static_cast<uint8_t>(b3.hmask[l] | ((q[e] >> 2) << (4 * h + s4)));
      }
    }
  }
  pack_q3_k_scales(sc3, b3.scales);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(q3_k_scale(b3.scales, j), sc3[j]) << j;
  float y2[256], y3[256];
  dequantize_row_ref(DType::kQ2_K, &b2, y2, 256);
  dequantize_row_ref(DType::kQ3_K, &b3, y3, 256);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 16;
    EXPECT_EQ(y2[e], static_cast<float>((1 + j % 15) * (q[e] & 3)) - 0.5f * static_cast<float>(j % 4)) << e;
    EXPECT_EQ(y3[e], static_cast<float>(sc3[j] * (q[e] - 4))) << e;
  }
}

// The searched Q2_K / Q3_K quantization: on normal data its squared error is 0.068 and 0.021
// of the signal's energy; quantizing every block range-covering (the fallback, all the
// bound promises) gives 0.126 and 0.035.
TEST(QuantRoundTrip, LowBitSearchBeatsRangeCovering) {
  for (DType t : {DType::kQ2_K, DType::kQ3_K}) {
    const int64_t n = 64 * 256;
    auto x = testing::make_data(Dist::kNormal, n, 99u);
    const auto y = testing::dequantize(t, testing::quantize(t, x), n);
    double sse = 0.0, ss = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      sse += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
      ss += static_cast<double>(x[i]) * x[i];
    }
    EXPECT_LT(sse / ss, t == DType::kQ2_K ? 0.075 : 0.023) << dtype_name(t);
  }
}

// quantize + dequantize stays within roundtrip_error_bound * (the block's max |x|) for every
// distribution, and the bound is not absurdly loose (some block gets at least 1/8 of it
// for the coarse formats, which would be impossible if the quantizer were broken).
TEST(QuantRoundTrip, WithinDocumentedBound) {
  for (DType t : all_quantizable()) {
    const int bs = traits(t).block_size == 1 ? 32 : traits(t).block_size;
    const double bound = roundtrip_error_bound(t);
    double worst = 0.0;  // the largest err / (bound * amax) seen
    for (Dist dist : testing::kAllDists) {
      const int64_t n = 8 * 256;
      auto x = testing::make_data(dist, n, 1234u + static_cast<uint32_t>(dist));
      const auto q = testing::quantize(t, x);
      const auto y = testing::dequantize(t, q, n);
      for (int64_t b0 = 0; b0 < n; b0 += bs) {
        double amax = 0.0, err = 0.0;
        for (int64_t i = b0; i < b0 + bs; ++i) {
          amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
          err = std::max(err, std::fabs(static_cast<double>(x[i]) - y[i]));
        }
        ASSERT_LE(err, bound * amax) << dtype_name(t) << " dist " << static_cast<int>(dist) << " block " << b0 / bs;
        if (amax > 0) worst = std::max(worst, err / (bound * amax));
      }
    }
    if (t != DType::kF32) {
      EXPECT_GT(worst, 0.3) << dtype_name(t) << ": the bound is far looser than needed";
    }
  }
}

TEST(QuantRoundTrip, ZeroBlocksStayZero) {
  for (DType t : all_quantizable()) {
    std::vector<float> x(512, 0.0f);
    const auto y = testing::dequantize(t, testing::quantize(t, x), 512);
    for (float v : y) ASSERT_EQ(v, 0.0f) << dtype_name(t);
  }
}

TEST(QuantRoundTrip, Q8PartnersCarryTheirSums) {
  auto x = testing::make_data(Dist::kNormal, 1024, 7);
  const auto q81 = testing::quantize(DType::kQ8_1, x);
  for (int b = 0; b < 32; ++b) {
    const auto blk = load_block<BlockQ8_1>(q81.data(), b);
    int s = 0;
    for (int8_t v : blk.qs) s += v;
    // s is d * sum(q) with d before its rounding to f16, as ggml defines it.
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * b + i]));
    EXPECT_EQ(blk.s, fp32_to_fp16(static_cast<float>(s) * (amax / 127.0f)));
  }
  const auto q8k = testing::quantize(DType::kQ8_K, x);
  for (int b = 0; b < 4; ++b) {
    const auto blk = load_block<BlockQ8_K>(q8k.data(), b);
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += blk.qs[16 * j + i];
      EXPECT_EQ(blk.bsums[j], s);
    }
  }
}

// vec_dot_ref is the dot product of the dequantized rows. Dequantization rounds each value
// once or twice in float (2^-23 relative each); the min formats' partner Q8_1 stores
// s = d * sum(q) in f16 (2^-11 relative), which the reference uses as the format intends.
TEST(VecDotRef, EqualsDotOfDequantizedRows) {
  for (DType t : testing::weight_types()) {
    const DType p = traits(t).dot_partner;
    for (int64_t n : {256, 1024, 4096}) {
      for (Dist dist : {Dist::kNormal, Dist::kPositive, Dist::kOutliers, Dist::kWideRange}) {
        auto xw = testing::make_data(dist, n, 99u + static_cast<uint32_t>(n));
        auto xa = testing::make_data(Dist::kNormal, n, 5u + static_cast<uint32_t>(n));
        const auto w = testing::quantize(t, xw);
        const auto a = testing::quantize(p, xa);
        const auto wf = testing::dequantize(t, w, n);
        const auto af = testing::dequantize(p, a, n);
        double expect = 0.0;
        for (int64_t i = 0; i < n; ++i) expect += static_cast<double>(wf[i]) * af[i];
        const double got = vec_dot_ref(t, w.data(), a.data(), n);
        const double mag = vec_dot_magnitude_ref(t, w.data(), a.data(), n);
        const double rel = p == DType::kQ8_1 ? 0x1p-10 : 0x1p-21;
        EXPECT_NEAR(got, expect, rel * mag + 1e-30) << dtype_name(t) << " n=" << n;
        EXPECT_GE(mag, std::fabs(got) * (1 - 1e-12));
      }
    }
  }
}

}  // namespace
}  // namespace metro::kernels
