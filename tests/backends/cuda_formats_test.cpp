// The CUDA backend's block-format functions (backends/cuda/formats.h), built for the host
// and checked against the scalar references of kernels/: padded weight blocks dequantize
// to the reference's bits, activations quantize to the reference's bytes, block dot
// products stay within the harness's bound of vec_dot_ref, KV rows are the reference's
// bytes. These run on every machine; the kernels that call the functions need a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cuda/formats.h"
#include "base/fp16.h"
#include "kernels/attention_impl.h"
#include "kernels/kernel_test_util.h"
#include "kernels/quant_ref.h"

namespace metro::backends::cuda {
namespace {

namespace kt = metro::kernels::testing;
using kernels::DType;

// The weight types the CUDA backend reads (Q2_K and Q3_K are CPU-only).
std::vector<DType> cuda_weight_types() {
  std::vector<DType> out;
  for (DType t : kt::weight_types()) {
    if (t != DType::kQ2_K && t != DType::kQ3_K) out.push_back(t);
  }
  return out;
}

std::vector<uint8_t> padded(DType t, const std::vector<uint8_t>& src, int64_t n) {
  std::vector<uint8_t> out(static_cast<size_t>(padded_row_bytes(t, n)));
  pad_row(t, src.data(), out.data(), n);
  return out;
}

TEST(CudaFormats, PaddedBlocksKeepEveryFieldAligned) {
  for (DType t : cuda_weight_types()) {
    const BlockGeom g = block_geom(t);
    ASSERT_GT(g.elems, 0) << kernels::dtype_name(t);
    EXPECT_EQ(g.elems, kernels::traits(t).block_size);
    EXPECT_EQ(g.src_bytes, kernels::traits(t).bytes_per_block);
    if (g.elems > 1) {
      EXPECT_EQ(g.bytes % 4, 0) << kernels::dtype_name(t);
    }
  }
}

TEST(CudaFormats, DequantizedElementsAreTheReferenceBits) {
  uint32_t seed = 1;
  for (DType t : cuda_weight_types()) {
    for (kt::Dist dist : kt::kAllDists) {
      const int64_t n = 512;
      const auto q = kt::quantize(t, kt::make_data(dist, n, seed++));
      const auto want = kt::dequantize(t, q, n);
      const auto p = padded(t, q, n);
      const BlockGeom g = block_geom(t);
      for (int64_t i = 0; i < n; ++i) {
        const float got = dequant_elem(t, p.data() + i / g.elems * g.bytes, static_cast<int>(i % g.elems));
        ASSERT_EQ(f32_bits(got), f32_bits(want[static_cast<size_t>(i)]))
            << kernels::dtype_name(t) << " element " << i << ": " << got << " vs " << want[static_cast<size_t>(i)];
      }
    }
  }
}

TEST(CudaFormats, HalfConversionsAreTheReferenceBits) {
  std::mt19937 rng(5);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    const float f = bits_f32(bits);
    const uint16_t want = fp32_to_fp16(f);
    ASSERT_EQ(f32_to_fp16(f), want) << std::hex << bits;
  }
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float a = fp16_to_f32(static_cast<uint16_t>(h)), b = fp16_to_fp32(static_cast<uint16_t>(h));
    ASSERT_TRUE(f32_bits(a) == f32_bits(b) || (std::isnan(a) && std::isnan(b))) << std::hex << h;
  }
}

// The device blocks hold exactly what quantize_row_ref's blocks hold.
TEST(CudaFormats, ActivationsQuantizeToTheReferenceValues) {
  uint32_t seed = 40;
  for (DType partner : {DType::kQ8_0, DType::kQ8_1, DType::kQ8_K}) {
    for (kt::Dist dist : kt::kAllDists) {
      const int64_t n = 512;
      const auto x = kt::make_data(dist, n, seed++);
      const auto ref = kt::quantize(partner, x);
      const int eb = act_block_elems(partner), ab = act_block_bytes(partner);
      std::vector<uint8_t> got(static_cast<size_t>(act_row_bytes(partner, n)));
      for (int64_t b = 0; b < n / eb; ++b) quantize_act_block(partner, x.data() + b * eb, got.data() + b * ab);
      const int rb = kernels::traits(partner).bytes_per_block;
      for (int64_t b = 0; b < n / eb; ++b) {
        const uint8_t* r = ref.data() + b * rb;
        const uint8_t* g = got.data() + b * ab;
        if (partner == DType::kQ8_K) {
          ASSERT_EQ(0, std::memcmp(r, g + 256, 4)) << "d of block " << b;
          ASSERT_EQ(0, std::memcmp(r + 4, g, 256)) << "qs of block " << b;
          ASSERT_EQ(0, std::memcmp(r + 260, g + 260, 32)) << "bsums of block " << b;
        } else {
          const int q_off = partner == DType::kQ8_1 ? 4 : 2;
          ASSERT_EQ(0, std::memcmp(r + q_off, g, 32)) << kernels::dtype_name(partner) << " qs of block " << b;
          ASSERT_EQ(f32_bits(fp16_to_fp32(load_u16(r))), f32_bits(load_f32(g + 32))) << "d of block " << b;
          if (partner == DType::kQ8_1) {
            ASSERT_EQ(f32_bits(fp16_to_fp32(load_u16(r + 2))), f32_bits(load_f32(g + 36))) << "s of block " << b;
          }
        }
      }
    }
  }
}

template <DType T>
double row_dot(const uint8_t* w, const uint8_t* a, int64_t n) {
  const BlockGeom g = block_geom(T);
  const DType partner = kernels::traits(T).dot_partner;
  const int ab = act_block_bytes(partner), ae = act_block_elems(partner);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / g.elems; ++b) sum += block_dot<T>(w + b * g.bytes, a + b * g.elems / ae * ab);
  return sum;
}

double row_dot(DType t, const uint8_t* w, const uint8_t* a, int64_t n) {
  switch (t) {
    case DType::kQ8_0: return row_dot<DType::kQ8_0>(w, a, n);
    case DType::kQ4_0: return row_dot<DType::kQ4_0>(w, a, n);
    case DType::kQ4_1: return row_dot<DType::kQ4_1>(w, a, n);
    case DType::kQ5_0: return row_dot<DType::kQ5_0>(w, a, n);
    case DType::kQ5_1: return row_dot<DType::kQ5_1>(w, a, n);
    case DType::kQ4_K: return row_dot<DType::kQ4_K>(w, a, n);
    case DType::kQ5_K: return row_dot<DType::kQ5_K>(w, a, n);
    case DType::kQ6_K: return row_dot<DType::kQ6_K>(w, a, n);
    default: ADD_FAILURE() << "not a quantized type"; return 0.0;
  }
}

// The harness's product bound (tests/backends/backend_ops_test.cpp): the block terms
// combined in float, 2 (n_terms + 8) u of the magnitude.
TEST(CudaFormats, BlockDotsMatchTheReferenceWithinTheProductBound) {
  uint32_t seed = 80;
  for (DType t : cuda_weight_types()) {
    if (!kernels::traits(t).quantized) continue;
    const DType partner = kernels::traits(t).dot_partner;
    for (kt::Dist dist : kt::kAllDists) {
      const int64_t n = 1024;
      const auto wq = kt::quantize(t, kt::make_data(kt::Dist::kNormal, n, seed++));
      const auto x = kt::make_data(dist, n, seed++);
      const auto aref = kt::quantize(partner, x);
      const int eb = act_block_elems(partner), ab = act_block_bytes(partner);
      std::vector<uint8_t> a(static_cast<size_t>(act_row_bytes(partner, n)));
      for (int64_t b = 0; b < n / eb; ++b) quantize_act_block(partner, x.data() + b * eb, a.data() + b * ab);
      const auto wp = padded(t, wq, n);
      const double want = kernels::vec_dot_ref(t, wq.data(), aref.data(), n);
      const double mag = kernels::vec_dot_magnitude_ref(t, wq.data(), aref.data(), n);
      const double n_terms = static_cast<double>(n / kernels::traits(partner).block_size);
      const double got = row_dot(t, wp.data(), a.data(), n);
      EXPECT_LE(std::fabs(got - want), 2 * (n_terms + 8) * 0x1p-24 * mag + 1e-30)
          << kernels::dtype_name(t) << ": got " << got << ", want " << want;
    }
  }
}

TEST(CudaFormats, KvRowsAreTheReferenceBytes) {
  uint32_t seed = 120;
  for (kt::Dist dist : kt::kAllDists) {
    const auto x = kt::make_data(dist, 128, seed++);
    const auto want = kt::quantize(DType::kQ8_0, x);
    std::vector<uint8_t> got(want.size());
    for (int b = 0; b < 4; ++b) store_q8_0_block(x.data() + 32 * b, got.data() + 34 * b);
    EXPECT_EQ(got, want);
  }
}

TEST(CudaFormats, QueryBlocksQuantizeAsTheCpuAttention) {
  uint32_t seed = 140;
  for (kt::Dist dist : kt::kAllDists) {
    auto x = kt::make_data(dist, 64, seed++);
    if (dist == kt::Dist::kSparse) x[5] = NAN;
    int8_t qw[64], qg[64];
    float dw[2];
    kernels::detail::quantize_query_q8(x.data(), 64, qw, dw);
    for (int b = 0; b < 2; ++b) {
      const float dg = quantize_query_block(x.data() + 32 * b, qg + 32 * b);
      EXPECT_TRUE(f32_bits(dg) == f32_bits(dw[b]) || (std::isnan(dg) && std::isnan(dw[b])));
    }
    EXPECT_EQ(0, std::memcmp(qw, qg, 64));
  }
}

// The CUDA attention's Q8_0 scores: the query rounded by quantize_query_block and scored
// by score_q8_row against stored keys give the CPU kernels' score bits.
TEST(CudaFormats, Q8KeyScoresAreTheCpuAttentionBits) {
  uint32_t seed = 160;
  for (kt::Dist dist : kt::kAllDists) {
    for (int hd : {32, 64, 128, 256}) {
      const auto q = kt::make_data(dist, static_cast<size_t>(hd), seed++);
      alignas(16) int8_t qw[256], qg[256];
      float dw[8], dg[8];
      kernels::detail::quantize_query_q8(q.data(), hd, qw, dw);
      for (int b = 0; b < hd / 32; ++b) dg[b] = quantize_query_block(q.data() + 32 * b, qg + 32 * b);
      for (int key = 0; key < 8; ++key) {
        const auto k = kt::make_data(key % 2 ? dist : kt::Dist::kNormal, static_cast<size_t>(hd), seed++);
        std::vector<uint8_t> row(static_cast<size_t>(hd / 32 * 34) + 2);
        uint8_t* krow = row.data() + 2 * (key % 2);  // rows sit at any 2-aligned offset in a page
        for (int b = 0; b < hd / 32; ++b) store_q8_0_block(k.data() + 32 * b, krow + 34 * b);
        const float want = kernels::detail::score_q8_ref(qw, dw, krow, hd);
        const float got = score_q8_row(qg, dg, krow, hd);
        EXPECT_EQ(f32_bits(got), f32_bits(want)) << "hd " << hd << " key " << key;
      }
    }
  }
}

}  // namespace
}  // namespace metro::backends::cuda
