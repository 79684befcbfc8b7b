// Reference dot products of a weight row with its activation partner, in double, and the
// round-trip error bounds of every format.
//
// The dot products are defined block by block the way the formats are meant to be
// multiplied: integer sums of quant products times the two scales, plus, for formats with
// a min, the min times the partner's stored sum term (Q8_1's s, Q8_K's bsums). A fast
// kernel computes the same terms (the integer parts exactly) and only rounds differently
// when it combines them in float.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "base/check.h"
#include "base/fp16.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_ref.h"

namespace metro::kernels {

namespace {

double h2d(uint16_t h) { return static_cast<double>(fp16_to_fp32(h)); }

// With kAbs, every term and every integer product is taken by absolute value: the sum of
// magnitudes that bounds the rounding error of any order of float accumulation.
template <bool kAbs>
double mag(double v) {
  return kAbs ? std::fabs(v) : v;
}

template <bool kAbs>
int64_t imul(int a, int b) {
  const int64_t p = static_cast<int64_t>(a) * b;
  return kAbs ? std::llabs(p) : p;
}

// Quant values 0..31 (or signed) of one 32-block of a 4/5-bit format, before any offset.
void nibbles(const uint8_t qs[16], int q[32]) {
  for (int i = 0; i < 16; ++i) {
    q[i] = qs[i] & 0x0F;
    q[i + 16] = qs[i] >> 4;
  }
}

void add_high_bits(const uint8_t qh_bytes[4], int q[32]) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (int i = 0; i < 32; ++i) q[i] |= static_cast<int>(((qh >> i) & 1u) << 4);
}

// The 256 values q - 32 of a Q6_K block (layout in quant_blocks.h).
void q6_k_values(const BlockQ6_K& b, int q[256]) {
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t lo = b.ql[64 * h + l], lo2 = b.ql[64 * h + l + 32], hi = b.qh[32 * h + l];
      q[128 * h + l] = ((lo & 0x0F) | ((hi & 3) << 4)) - 32;
      q[128 * h + l + 32] = ((lo2 & 0x0F) | (((hi >> 2) & 3) << 4)) - 32;
      q[128 * h + l + 64] = ((lo >> 4) | (((hi >> 4) & 3) << 4)) - 32;
      q[128 * h + l + 96] = ((lo2 >> 4) | (((hi >> 6) & 3) << 4)) - 32;
    }
  }
}

// Sum over the blocks of a 32-block weight format times Q8_0/Q8_1 acts. `decode` fills the
// weight block's integer values (offset already applied), its scale and its min (0 if none).
template <bool kAbs, class WBlock, class ABlock, class Decode>
double dot_32(const void* w, const void* a, int64_t n, Decode decode) {
  double sum = 0.0;
  for (int64_t b = 0; b < n / kQK; ++b) {
    const auto wb = load_block<WBlock>(w, b);
    const auto ab = load_block<ABlock>(a, b);
    int q[32];
    double dw = 0.0, mw = 0.0;
    decode(wb, q, &dw, &mw);
    int64_t isum = 0;
    for (int i = 0; i < 32; ++i) isum += imul<kAbs>(q[i], ab.qs[i]);
    sum += mag<kAbs>(dw * h2d(ab.d) * static_cast<double>(isum));
    if constexpr (std::is_same_v<ABlock, BlockQ8_1>) sum += mag<kAbs>(mw * h2d(ab.s));
  }
  return sum;
}

// Q4_K / Q5_K times Q8_K: sub-block sums scaled by the 6-bit scales, minus the mins times
// the partner's 16-element sums.
template <bool kAbs, class WBlock>
double dot_k_affine(const void* w, const void* a, int64_t n) {
  double sum = 0.0;
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const auto wb = load_block<WBlock>(w, b);
    const auto ab = load_block<BlockQ8_K>(a, b);
    int64_t scaled = 0, mins = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      unpack_scale_min_k4(wb.scales, j, &sc, &m);
      const int c = j / 2, hi_nibble = j % 2;
      int64_t isum = 0;
      for (int l = 0; l < 32; ++l) {
        const uint8_t byte = wb.qs[32 * c + l];
        int q = hi_nibble ? byte >> 4 : byte & 0x0F;
        if constexpr (std::is_same_v<WBlock, BlockQ5_K>) q |= ((wb.qh[l] >> j) & 1) << 4;
        isum += imul<kAbs>(q, ab.qs[32 * j + l]);
      }
      scaled += sc * isum;
      mins += imul<kAbs>(m, ab.bsums[2 * j] + ab.bsums[2 * j + 1]);
    }
    const double da = static_cast<double>(ab.d);
    const double min_term = h2d(wb.dmin) * da * static_cast<double>(mins);
    sum += mag<kAbs>(h2d(wb.d) * da * static_cast<double>(scaled));
    sum += kAbs ? std::fabs(min_term) : -min_term;
  }
  return sum;
}

template <bool kAbs>
double dot_q6_k(const void* w, const void* a, int64_t n) {
  double sum = 0.0;
  int q[kQKK];
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const auto wb = load_block<BlockQ6_K>(w, b);
    const auto ab = load_block<BlockQ8_K>(a, b);
    q6_k_values(wb, q);
    int64_t scaled = 0;
    for (int j = 0; j < 16; ++j) {
      int64_t isum = 0;
      for (int i = 0; i < 16; ++i) isum += imul<kAbs>(q[16 * j + i], ab.qs[16 * j + i]);
      scaled += (kAbs ? std::abs(wb.scales[j]) : wb.scales[j]) * isum;
    }
    sum += mag<kAbs>(h2d(wb.d) * static_cast<double>(ab.d) * static_cast<double>(scaled));
  }
  return sum;
}

// Q2_K / Q3_K times Q8_K: 16 sub-blocks of 16, each sum scaled by its scale; Q2_K's mins
// times the partner's 16-element sums are subtracted.
template <bool kAbs, class WBlock>
double dot_k_low(const void* w, const void* a, int64_t n) {
  double sum = 0.0;
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const auto wb = load_block<WBlock>(w, b);
    const auto ab = load_block<BlockQ8_K>(a, b);
    int64_t scaled = 0, mins = 0;
    for (int j = 0; j < 16; ++j) {
      int64_t isum = 0;
      int sc;
      if constexpr (std::is_same_v<WBlock, BlockQ2_K>) {
        for (int i = 0; i < 16; ++i) isum += imul<kAbs>(q2_k_value(wb.qs, 16 * j + i), ab.qs[16 * j + i]);
        sc = wb.scales[j] & 0x0F;
        mins += imul<kAbs>(wb.scales[j] >> 4, ab.bsums[j]);
      } else {
        for (int i = 0; i < 16; ++i) {
          isum += imul<kAbs>(q3_k_value(wb.hmask, wb.qs, 16 * j + i) - 4, ab.qs[16 * j + i]);
        }
        sc = q3_k_scale(wb.scales, j);
      }
      scaled += (kAbs ? std::abs(sc) : sc) * isum;
    }
    const double da = static_cast<double>(ab.d);
    sum += mag<kAbs>(h2d(wb.d) * da * static_cast<double>(scaled));
    if constexpr (std::is_same_v<WBlock, BlockQ2_K>) {
      const double min_term = h2d(wb.dmin) * da * static_cast<double>(mins);
      sum += kAbs ? std::fabs(min_term) : -min_term;
    }
  }
  return sum;
}

template <bool kAbs>
double dot_sym8(const void* w, const void* a, int64_t n, DType t) {
  // Q8_0 x Q8_0, Q8_1 x Q8_1, Q8_K x Q8_K: both sides plain d * q.
  const auto& tr = traits(t);
  double sum = 0.0;
  for (int64_t b = 0; b < n / tr.block_size; ++b) {
    const auto* wb = static_cast<const uint8_t*>(w) + b * tr.bytes_per_block;
    const auto* ab = static_cast<const uint8_t*>(a) + b * tr.bytes_per_block;
    double dw, da;
    int q_off;
    if (t == DType::kQ8_K) {
      float fw, fa;
      std::memcpy(&fw, wb, 4);
      std::memcpy(&fa, ab, 4);
      dw = fw;
      da = fa;
      q_off = 4;
    } else {
      uint16_t hw, ha;
      std::memcpy(&hw, wb, 2);
      std::memcpy(&ha, ab, 2);
      dw = h2d(hw);
      da = h2d(ha);
      q_off = t == DType::kQ8_1 ? 4 : 2;
    }
    int64_t isum = 0;
    for (int i = 0; i < tr.block_size; ++i) {
      isum += imul<kAbs>(static_cast<int8_t>(wb[q_off + i]), static_cast<int8_t>(ab[q_off + i]));
    }
    sum += mag<kAbs>(dw * da * static_cast<double>(isum));
  }
  return sum;
}

template <bool kAbs>
double dot_float(DType t, const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const float*>(a);
  double sum = 0.0;
  float buf[256];
  for (int64_t i0 = 0; i0 < n; i0 += 256) {
    const int64_t len = std::min<int64_t>(256, n - i0);
    dequantize_row_ref(t, static_cast<const uint8_t*>(w) + row_bytes(t, i0), buf, len);
    for (int64_t i = 0; i < len; ++i) sum += mag<kAbs>(static_cast<double>(buf[i]) * x[i0 + i]);
  }
  return sum;
}

template <bool kAbs>
double dot_any(DType wt, const void* w, const void* a, int64_t n) {
  METRO_CHECK(n % traits(wt).block_size == 0);
  switch (wt) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16: return dot_float<kAbs>(wt, w, a, n);
    case DType::kQ8_0:
    case DType::kQ8_1:
    case DType::kQ8_K: return dot_sym8<kAbs>(w, a, n, wt);
    case DType::kQ4_0:
      return dot_32<kAbs, BlockQ4_0, BlockQ8_0>(w, a, n, [](const BlockQ4_0& b, int* q, double* d, double*) {
        nibbles(b.qs, q);
        for (int i = 0; i < 32; ++i) q[i] -= 8;
        *d = h2d(b.d);
      });
    case DType::kQ5_0:
      return dot_32<kAbs, BlockQ5_0, BlockQ8_0>(w, a, n, [](const BlockQ5_0& b, int* q, double* d, double*) {
        nibbles(b.qs, q);
        add_high_bits(b.qh, q);
        for (int i = 0; i < 32; ++i) q[i] -= 16;
        *d = h2d(b.d);
      });
    case DType::kQ4_1:
      return dot_32<kAbs, BlockQ4_1, BlockQ8_1>(w, a, n, [](const BlockQ4_1& b, int* q, double* d, double* m) {
        nibbles(b.qs, q);
        *d = h2d(b.d);
        *m = h2d(b.m);
      });
    case DType::kQ5_1:
      return dot_32<kAbs, BlockQ5_1, BlockQ8_1>(w, a, n, [](const BlockQ5_1& b, int* q, double* d, double* m) {
        nibbles(b.qs, q);
        add_high_bits(b.qh, q);
        *d = h2d(b.d);
        *m = h2d(b.m);
      });
    case DType::kQ4_K: return dot_k_affine<kAbs, BlockQ4_K>(w, a, n);
    case DType::kQ5_K: return dot_k_affine<kAbs, BlockQ5_K>(w, a, n);
    case DType::kQ6_K: return dot_q6_k<kAbs>(w, a, n);
    case DType::kQ2_K: return dot_k_low<kAbs, BlockQ2_K>(w, a, n);
    case DType::kQ3_K: return dot_k_low<kAbs, BlockQ3_K>(w, a, n);
    case DType::kCount: break;
  }
  METRO_CHECK_MSG(false, "vec_dot_ref: not a DType");
  return 0.0;
}

}  // namespace

double vec_dot_ref(DType wt, const void* w, const void* a, int64_t n) { return dot_any<false>(wt, w, a, n); }

double vec_dot_magnitude_ref(DType wt, const void* w, const void* a, int64_t n) {
  return dot_any<true>(wt, w, a, n);
}

// Derivations (amax = the block's max |x|; u16 = 2^-11, the relative rounding of binary16;
// "normal range": the block's scales are normal binary16 numbers, amax above ~1e-3):
//  F16:  round to nearest, |err| <= u16 * |x| <= 2^-11 amax.
//  BF16: |err| <= 2^-8 amax.
//  Q8_0, Q8_1: d = amax/127, err <= d/2 = amax/254 from rounding, plus |q| <= 127 times the
//        f16 rounding of d (127 * d * u16 = amax * u16): 1/254 + 2^-11 = 0.004425.
//  Q8_K: float scale: 1/254 + 2^-24 (its rounding, negligible) -> 0.00394.
//  Q4_0: d = -max/8 maps the extreme value to level -8; its opposite clamps to +7, one full
//        step d = amax/8 away; other values are within d/2. The f16 rounding of d adds
//        at most 8 * d * u16: 1/8 * (1 + 8 * 2^-11) = 0.12549.
//  Q5_0: the same with 16 levels: 1/16 * (1 + 16 * 2^-11) = 0.06299.
//  Q4_1: d = (max-min)/15 <= 2 amax/15, err <= d/2 <= amax/15, plus the f16 rounding of
//        m (|m| <= amax: amax * u16) and of d (15 * d * u16 <= 2 amax * u16):
//        1/15 + 3 * 2^-11 = 0.06813.
//  Q5_1: 1/31 + 3 * 2^-11 = 0.03372.
//  Q4_K, Q5_K (256-blocks; quant_ref_k.cpp): the min level of sub-block j is rounded up
//        to a multiple of dmin <= amax/63 (f16 rounded up, factor 1 + 2^-10), so the span a
//        sub-block must cover is <= 2 amax + dmin; its step d*sc[j] exceeds span/L by less
//        than one d <= step_max/63. err <= step/2 <= (2 + 1/63)/L * (1 + 1/63) * amax/2
//        * (1 + 2^-9): L = 15: 0.06840, L = 31: 0.03310.
//  Q6_K: step of sub-block j = d * sc[j] < amax_j/31 + d, d <= max_j(amax_j/31)/127 (f16
//        rounded up), err <= step/2 <= amax/62 * (1 + 1/127) * (1 + 2^-10) = 0.01627.
//  Q2_K, Q3_K (quant_ref_k_low.cpp): the searched quantization is kept only where it stays
//        within the bound of the range-covering one, which is used otherwise. Q2_K covers
//        a sub-block as Q4_K does with 4 levels (L = 3) and 4-bit scales and mins (15 for
//        63): err <= (2 + 1/15)/3 * (1 + 1/15) * amax/2 * (1 + 2^-9) = 0.3681. Q3_K: step
//        s = max(-min/4, max/3) <= amax/3 puts both ends within levels -4..3, rounded up
//        to the grid of d <= s_max/31: err <= amax/6 * (1 + 1/31) * (1 + 2^-9) = 0.1724.
// Each bound gets a margin of a few float roundings of the quantizer's arithmetic.
double roundtrip_error_bound(DType t) {
  switch (t) {
    case DType::kF32: return 0.0;
    case DType::kF16: return 0x1p-11;
    case DType::kBF16: return 0x1p-8;
    case DType::kQ8_0:
    case DType::kQ8_1: return 0.00443;
    case DType::kQ8_K: return 0.00394;
    case DType::kQ4_0: return 0.1256;
    case DType::kQ5_0: return 0.0631;
    case DType::kQ4_1: return 0.0682;
    case DType::kQ5_1: return 0.0338;
    case DType::kQ4_K: return 0.0685;
    case DType::kQ5_K: return 0.0332;
    case DType::kQ6_K: return 0.0163;
    case DType::kQ2_K: return 0.369;
    case DType::kQ3_K: return 0.173;
    case DType::kCount: break;
  }
  METRO_CHECK_MSG(false, "roundtrip_error_bound: not a DType");
  return 0.0;
}

}  // namespace metro::kernels
