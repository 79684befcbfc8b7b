// AVX2 kernels for the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) times Q8_K activations,
// row-major, and Q4_K, Q5_K and Q6_K in the x8 interleaved layout (Q2_K and Q3_K's x8
// kernels: matmul_k_low_avx2.cpp).
//
// Per output element, super-block after super-block:
//   scaled = exact sum over sub-blocks of scale[j] * sum(q * a)   (Q6_K: q - 32, Q3_K: q - 4)
//   mins   = exact sum over sub-blocks of min[j] * (act 16-sums)  (Q2_K/Q4_K/Q5_K only)
//   acc    = fma(float(scaled), d * da, acc);  acc = fma(-float(mins), dmin * da, acc)
// Each weight super-block is unpacked once per tile and used for all of its act rows.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "base/check.h"
#include "kernels/kernels_avx2.h"
#include "kernels/matmul_k_x8_avx2.h"
#include "kernels/quant_blocks.h"
#include "kernels/repack.h"
#include "kernels/simd_avx2.h"

namespace metro::kernels::avx2 {

namespace {

// One super-block ready for the act loop: 8 vectors of 32 unsigned quants (in element
// order) and 16 sub-scales as 16-bit pairs (low 128 bits: elements 0-15 of the vector).
struct Unpacked {
  __m256i q[8];
  __m256i scale[8];
  int32_t mins[16];    // Q4_K/Q5_K: m[j] (8); Q2_K: the 16 sub-block mins
  int32_t scale6[16];  // Q6_K, Q3_K: the sub-block scales
  float d, dmin;
};

__m256i fifth_bit(__m256i qh, int bit) {
  const __m256i v = bit <= 4 ? _mm256_sll_epi16(qh, _mm_cvtsi32_si128(4 - bit))
                             : _mm256_srl_epi16(qh, _mm_cvtsi32_si128(bit - 4));
  return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

// Blocks are read in place: a stack copy would make the vector loads that straddle the
// copy's stores fail store-to-load forwarding.
template <class B>
void unpack_k_affine(const uint8_t* row, int64_t b, Unpacked* u) {
  const uint8_t* blk = row + static_cast<size_t>(b) * sizeof(B);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256i qh = _mm256_setzero_si256();
  if constexpr (std::is_same_v<B, BlockQ5_K>) qh = load256(blk + offsetof(BlockQ5_K, qh));
  for (int c = 0; c < 4; ++c) {
    const __m256i w = load256(blk + offsetof(B, qs) + 32 * c);
    u->q[2 * c] = _mm256_and_si256(w, m4);
    u->q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
    if constexpr (std::is_same_v<B, BlockQ5_K>) {
      u->q[2 * c] = _mm256_or_si256(u->q[2 * c], fifth_bit(qh, 2 * c));
      u->q[2 * c + 1] = _mm256_or_si256(u->q[2 * c + 1], fifth_bit(qh, 2 * c + 1));
    }
  }
  uint8_t scales[12];
  std::memcpy(scales, blk + offsetof(B, scales), 12);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    unpack_scale_min_k4(scales, j, &sc, &m);
    u->scale[j] = _mm256_set1_epi16(sc);
    u->mins[j] = m;
  }
  uint16_t d, dmin;
  std::memcpy(&d, blk + offsetof(B, d), 2);
  std::memcpy(&dmin, blk + offsetof(B, dmin), 2);
  u->d = f16(d);
  u->dmin = f16(dmin);
}

void unpack_q6_k(const uint8_t* row, int64_t b, Unpacked* u) {
  const uint8_t* blk = row + static_cast<size_t>(b) * sizeof(BlockQ6_K);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = blk + offsetof(BlockQ6_K, ql) + 64 * h;
    const __m256i l0 = load256(ql), l1 = load256(ql + 32);
    const __m256i qh = load256(blk + offsetof(BlockQ6_K, qh) + 32 * h);
    u->q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2));
    u->q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2));
    u->q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m2));
    u->q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                      _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2));
  }
  int8_t scales[16];
  std::memcpy(scales, blk + offsetof(BlockQ6_K, scales), 16);
  // Vector v holds elements 32v..32v+31: sub-blocks 2v and 2v + 1.
  for (int v = 0; v < 8; ++v) {
    u->scale[v] = _mm256_setr_m128i(_mm_set1_epi16(scales[2 * v]), _mm_set1_epi16(scales[2 * v + 1]));
  }
  for (int j = 0; j < 16; ++j) u->scale6[j] = scales[j];
  uint16_t d;
  std::memcpy(&d, blk + offsetof(BlockQ6_K, d), 2);
  u->d = f16(d);
  u->dmin = 0.0f;
}

// Q2_K: vector v = 4h + s holds elements 128h + 32s .. + 31, bits 2s..2s+1 of qs[32h ..];
// its sub-blocks are 2v and 2v + 1.
void unpack_q2_k(const uint8_t* row, int64_t b, Unpacked* u) {
  const uint8_t* blk = row + static_cast<size_t>(b) * sizeof(BlockQ2_K);
  const __m256i m3 = _mm256_set1_epi8(3);
  for (int h = 0; h < 2; ++h) {
    const __m256i w = load256(blk + offsetof(BlockQ2_K, qs) + 32 * h);
    for (int s = 0; s < 4; ++s) {
      u->q[4 * h + s] = _mm256_and_si256(_mm256_srl_epi16(w, _mm_cvtsi32_si128(2 * s)), m3);
    }
  }
  uint8_t scales[16];
  std::memcpy(scales, blk + offsetof(BlockQ2_K, scales), 16);
  for (int v = 0; v < 8; ++v) {
    u->scale[v] = _mm256_setr_m128i(_mm_set1_epi16(scales[2 * v] & 0x0F), _mm_set1_epi16(scales[2 * v + 1] & 0x0F));
  }
  for (int j = 0; j < 16; ++j) u->mins[j] = scales[j] >> 4;
  uint16_t d, dmin;
  std::memcpy(&d, blk + offsetof(BlockQ2_K, d), 2);
  std::memcpy(&dmin, blk + offsetof(BlockQ2_K, dmin), 2);
  u->d = f16(d);
  u->dmin = f16(dmin);
}

// Q3_K: the low bits as Q2_K's; the third bit of vector v is bit v of hmask[l]. Unsigned
// q in 0..7 here; the - 4 is taken off with the act 16-sums (as Q6_K's - 32).
void unpack_q3_k(const uint8_t* row, int64_t b, Unpacked* u) {
  const uint8_t* blk = row + static_cast<size_t>(b) * sizeof(BlockQ3_K);
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  const __m256i hm = load256(blk + offsetof(BlockQ3_K, hmask));
  for (int h = 0; h < 2; ++h) {
    const __m256i w = load256(blk + offsetof(BlockQ3_K, qs) + 32 * h);
    for (int s = 0; s < 4; ++s) {
      const int v = 4 * h + s;
      const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(w, _mm_cvtsi32_si128(2 * s)), m3);
      const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(v)), one);
      u->q[v] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 2));
    }
  }
  uint8_t packed[12];
  std::memcpy(packed, blk + offsetof(BlockQ3_K, scales), 12);
  for (int j = 0; j < 16; ++j) u->scale6[j] = q3_k_scale(packed, j);
  for (int v = 0; v < 8; ++v) {
    u->scale[v] = _mm256_setr_m128i(_mm_set1_epi16(static_cast<int16_t>(u->scale6[2 * v])),
                                    _mm_set1_epi16(static_cast<int16_t>(u->scale6[2 * v + 1])));
  }
  uint16_t d;
  std::memcpy(&d, blk + offsetof(BlockQ3_K, d), 2);
  u->d = f16(d);
  u->dmin = 0.0f;
}

// kFmt: 2, 3, 4, 5 or 6.
template <int kFmt>
float step(const Unpacked& u, const uint8_t* act_block, float acc) {
  float da;
  std::memcpy(&da, act_block + offsetof(BlockQ8_K, d), 4);
  const uint8_t* aq = act_block + offsetof(BlockQ8_K, qs);
  int16_t bsums[16];
  std::memcpy(bsums, act_block + offsetof(BlockQ8_K, bsums), sizeof bsums);
  __m256i sum = _mm256_setzero_si256();
  for (int v = 0; v < 8; ++v) {
    const __m256i p = _mm256_maddubs_epi16(u.q[v], load256(aq + 32 * v));  // pairs <= 2*63*127
    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, u.scale[v]));
  }
  int32_t scaled = hsum_epi32(sum);
  int32_t mins = 0;
  if constexpr (kFmt == 6 || kFmt == 3) {
    // q - 32 (q - 4): subtract 32 (4) * scale * (16-sum of the act) per sub-block.
    int32_t off = 0;
    for (int j = 0; j < 16; ++j) off += u.scale6[j] * bsums[j];
    scaled -= (kFmt == 6 ? 32 : 4) * off;
  } else if constexpr (kFmt == 2) {
    for (int j = 0; j < 16; ++j) mins += u.mins[j] * bsums[j];
  } else {
    for (int j = 0; j < 8; ++j) mins += u.mins[j] * (bsums[2 * j] + bsums[2 * j + 1]);
  }
  __m128 r = _mm_set_ss(acc);
  r = _mm_fmadd_ss(_mm_set_ss(static_cast<float>(scaled)), _mm_set_ss(u.d * da), r);
  if constexpr (kFmt != 6 && kFmt != 3) {
    r = _mm_fnmadd_ss(_mm_set_ss(static_cast<float>(mins)), _mm_set_ss(u.dmin * da), r);
  }
  return _mm_cvtss_f32(r);
}

template <int kFmt>  // 2, 3, 4, 5, 6
void tile_k(const MatmulTile& t) {
  METRO_CHECK(t.n_acts <= kMaxTileActs);
  const int64_t nb = t.k / kQKK;
  float acc[kMaxTileActs];
  Unpacked u;
  for (int64_t j = 0; j < t.n_rows; ++j) {
    const uint8_t* row = t.w + static_cast<size_t>(j) * t.w_stride;
    std::fill(acc, acc + t.n_acts, 0.0f);
    for (int64_t b = 0; b < nb; ++b) {
      if constexpr (kFmt == 4) unpack_k_affine<BlockQ4_K>(row, b, &u);
      if constexpr (kFmt == 5) unpack_k_affine<BlockQ5_K>(row, b, &u);
      if constexpr (kFmt == 6) unpack_q6_k(row, b, &u);
      if constexpr (kFmt == 2) unpack_q2_k(row, b, &u);
      if constexpr (kFmt == 3) unpack_q3_k(row, b, &u);
      for (int64_t i = 0; i < t.n_acts; ++i) {
        const uint8_t* ab = t.a + static_cast<size_t>(i) * t.a_stride + static_cast<size_t>(b) * sizeof(BlockQ8_K);
        acc[i] = step<kFmt>(u, ab, acc[i]);
      }
    }
    for (int64_t i = 0; i < t.n_acts; ++i) t.y[static_cast<size_t>(i) * t.y_stride + static_cast<size_t>(j)] = acc[i];
  }
}

// ---- Q4_K in the x8 layout (repack.h) ---------------------------------------------------
// One SIMD lane per weight row, as the 32-block x8 kernels: per sub-block, the 16-bit pair
// sums of the 8 rows against an act's broadcast 4 bytes, times the lane's sub-block scale
// (madd with the scale in both halves), summed exactly in 32 bits; the mins against the
// act's 32-sums likewise. The integers equal tile_k<4>'s per output and the float steps are
// the same, so the two layouts give the same bits.

// kQ5: Q5_K, whose fifth bits make 5-bit quants (pair sums <= 7874): its 16-bit sums go to
// 32 bits every four maddubs instead of eight.
template <int R, bool kQ5 = false>
void q4_k_x8_micro(const uint8_t* group, const uint8_t* a, size_t a_stride, int64_t nb, float* y, size_t y_stride,
                   int rows, const uint8_t* pf) {
  using G = std::conditional_t<kQ5, BlockQ5_Kx8, BlockQ4_Kx8>;
  constexpr int64_t kS = static_cast<int64_t>(sizeof(G));
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  alignas(32) float acc[R][8];
  for (int i = 0; i < R; ++i) _mm256_store_ps(acc[i], _mm256_setzero_ps());
  for (int64_t b = 0; b < nb; ++b) {
    if (pf != nullptr) {
      for (int64_t off = (b * kS) & ~int64_t{63}; off < (b + 1) * kS; off += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(pf + off), _MM_HINT_T0);
      }
    }
    const uint8_t* gb = group + b * kS;
    const uint8_t* qs = gb + offsetof(G, qs);
    const uint8_t* ab[R];
    for (int i = 0; i < R; ++i) ab[i] = a + static_cast<size_t>(i) * a_stride + static_cast<size_t>(b) * sizeof(BlockQ8_K);
    __m256i isum[R];
    for (int i = 0; i < R; ++i) isum[i] = _mm256_setzero_si256();
    for (int h = 0; h < 8; ++h) {  // sub-block h: chunk h / 2, low or high nibbles
      const int c = h >> 1;
      const int shift = 4 * (h & 1);
      const int a_off = static_cast<int>(offsetof(BlockQ8_K, qs)) + 64 * c + 32 * (h & 1);
      const __m256i sc = scale_pairs(gb + offsetof(G, scales) + 8 * h);
      __m256i p[R];
      for (int t = 0; t < 8; ++t) {
        const __m256i w = load256(qs + 32 * (8 * c + t));
        __m256i q = _mm256_and_si256(_mm256_srl_epi16(w, _mm_cvtsi32_si128(shift)), m4);
        if constexpr (kQ5) q = _mm256_or_si256(q, fifth_bit(load256(gb + offsetof(BlockQ5_Kx8, qh) + 32 * t), h));
        for (int i = 0; i < R; ++i) {
          const __m256i x = _mm256_maddubs_epi16(q, bcast_i32(ab[i] + a_off + 4 * t));
          p[i] = t == 0 || (kQ5 && t == 4) ? x : _mm256_add_epi16(p[i], x);
          keep_reg(p[i]);
        }
        if (kQ5 && t == 3) {
          for (int i = 0; i < R; ++i) isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(p[i], sc));
        }
      }
      for (int i = 0; i < R; ++i) isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(p[i], sc));
    }
    const uint8_t* mins = gb + offsetof(G, mins);
    const __m256 d8 = load_f16x8(gb + offsetof(G, d));
    const __m256 dm8 = load_f16x8(gb + offsetof(G, dmin));
    __m256i mp[4];  // the mins of sub-blocks 2p and 2p + 1, once for every act row
    for (int q = 0; q < 4; ++q) mp[q] = min_pairs(mins + 16 * q, mins + 16 * q + 8);
    for (int i = 0; i < R; ++i) {
      int16_t bs[16];
      std::memcpy(bs, ab[i] + offsetof(BlockQ8_K, bsums), sizeof bs);
      __m256i ms = _mm256_setzero_si256();
      for (int j = 0; j < 8; j += 2) {
        const auto s0 = static_cast<uint16_t>(bs[2 * j] + bs[2 * j + 1]);
        const auto s1 = static_cast<uint16_t>(bs[2 * j + 2] + bs[2 * j + 3]);
        const __m256i act = _mm256_set1_epi32(static_cast<int32_t>(s0 | (static_cast<uint32_t>(s1) << 16)));
        ms = _mm256_add_epi32(ms, _mm256_madd_epi16(mp[j / 2], act));
      }
      float da;
      std::memcpy(&da, ab[i] + offsetof(BlockQ8_K, d), 4);
      const __m256 vda = _mm256_set1_ps(da);
      __m256 r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]), _mm256_mul_ps(d8, vda), _mm256_load_ps(acc[i]));
      r = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_mul_ps(dm8, vda), r);
      _mm256_store_ps(acc[i], r);
    }
  }
  for (int i = 0; i < R; ++i) store_lanes(y + static_cast<size_t>(i) * y_stride, _mm256_load_ps(acc[i]), rows);
}

template <int N, bool kQ5 = false>
void q4_k_x8_rest(int64_t n, const uint8_t* group, const uint8_t* a, size_t a_stride, int64_t nb, float* y,
                  size_t y_stride, int rows, const uint8_t* pf) {
  if constexpr (N > 0) {
    if (n == N) {
      q4_k_x8_micro<N, kQ5>(group, a, a_stride, nb, y, y_stride, rows, pf);
    } else {
      q4_k_x8_rest<N - 1, kQ5>(n, group, a, a_stride, nb, y, y_stride, rows, pf);
    }
  }
}

// ---- Q6_K in the x8 layout: vector v = 4h + s of a super-block holds elements
// 128h + 32s .. + 31 (as unpack_q6_k), low bits from ql word 16h + 8(s & 1) + t, high
// bits from qh word 8h + t; words 0-3 are sub-block 2v, words 4-7 sub-block 2v + 1. Two
// maddubs of 6-bit quants fill a 16-bit pair sum (<= 32004), so each pair goes through its
// madd with the lane's scale; the - 32 is taken off with the act 16-sums, as tile_k<6>.

template <int R>
void q6_k_x8_micro(const uint8_t* group, const uint8_t* a, size_t a_stride, int64_t nb, float* y, size_t y_stride,
                   int rows, const uint8_t* pf) {
  constexpr int64_t kS = static_cast<int64_t>(sizeof(BlockQ6_Kx8));
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
  alignas(32) float acc[R][8];
  for (int i = 0; i < R; ++i) _mm256_store_ps(acc[i], _mm256_setzero_ps());
  for (int64_t b = 0; b < nb; ++b) {
    if (pf != nullptr) {
      for (int64_t off = (b * kS) & ~int64_t{63}; off < (b + 1) * kS; off += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(pf + off), _MM_HINT_T0);
      }
    }
    const uint8_t* gb = group + b * kS;
    const uint8_t* ql = gb + offsetof(BlockQ6_Kx8, ql);
    const uint8_t* qh = gb + offsetof(BlockQ6_Kx8, qh);
    const auto* scales = reinterpret_cast<const int8_t*>(gb + offsetof(BlockQ6_Kx8, scales));
    const uint8_t* ab[R];
    for (int i = 0; i < R; ++i) ab[i] = a + static_cast<size_t>(i) * a_stride + static_cast<size_t>(b) * sizeof(BlockQ8_K);
    __m256i isum[R];
    for (int i = 0; i < R; ++i) isum[i] = _mm256_setzero_si256();
    if constexpr (R <= 2) {
      // Few act rows: each ql / qh word read once, its four vectors (s = 0..3) built
      // together, each summed for its own sub-block.
      for (int h = 0; h < 2; ++h) {
        for (int half = 0; half < 2; ++half) {
          for (int pair = 0; pair < 2; ++pair) {
            __m256i p[4][R];
            for (int u = 0; u < 2; ++u) {
              const int t = 4 * half + 2 * pair + u;
              const __m256i lw0 = load256(ql + 32 * (16 * h + t));
              const __m256i lw1 = load256(ql + 32 * (16 * h + 8 + t));
              const __m256i hw = load256(qh + 32 * (8 * h + t));
              const __m256i q[4] = {
                  _mm256_or_si256(_mm256_and_si256(lw0, m4), _mm256_and_si256(_mm256_slli_epi16(hw, 4), m2)),
                  _mm256_or_si256(_mm256_and_si256(lw1, m4), _mm256_and_si256(_mm256_slli_epi16(hw, 2), m2)),
                  _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lw0, 4), m4), _mm256_and_si256(hw, m2)),
                  _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lw1, 4), m4),
                                  _mm256_and_si256(_mm256_srli_epi16(hw, 2), m2))};
              for (int s4 = 0; s4 < 4; ++s4) {
                const int a_off = static_cast<int>(offsetof(BlockQ8_K, qs)) + 128 * h + 32 * s4 + 4 * t;
                for (int i = 0; i < R; ++i) {
                  const __m256i x = _mm256_maddubs_epi16(q[s4], bcast_i32(ab[i] + a_off));
                  p[s4][i] = u == 0 ? x : _mm256_add_epi16(p[s4][i], x);
                  keep_reg(p[s4][i]);
                }
              }
            }
            for (int s4 = 0; s4 < 4; ++s4) {
              const __m256i sc = signed_scale_pairs(scales + 8 * (2 * (4 * h + s4) + half));
              for (int i = 0; i < R; ++i) isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(p[s4][i], sc));
            }
          }
        }
      }
    }
    for (int v = 0; v < (R <= 2 ? 0 : 8); ++v) {
      const int h = v >> 2, s = v & 3;
      const int a_off = static_cast<int>(offsetof(BlockQ8_K, qs)) + 32 * v;
      for (int half = 0; half < 2; ++half) {  // sub-block 2v + half: words 4 half .. + 3
        const __m256i sc = signed_scale_pairs(scales + 8 * (2 * v + half));
        for (int pair = 0; pair < 2; ++pair) {
          __m256i p[R];
          for (int u = 0; u < 2; ++u) {
            const int t = 4 * half + 2 * pair + u;
            const __m256i lw = load256(ql + 32 * (16 * h + 8 * (s & 1) + t));
            const __m256i hw = load256(qh + 32 * (8 * h + t));
            const __m256i lo = s < 2 ? _mm256_and_si256(lw, m4) : _mm256_and_si256(_mm256_srli_epi16(lw, 4), m4);
            __m256i hi;
            if (s == 0) {
              hi = _mm256_slli_epi16(hw, 4);
            } else if (s == 1) {
              hi = _mm256_slli_epi16(hw, 2);
            } else if (s == 2) {
              hi = hw;
            } else {
              hi = _mm256_srli_epi16(hw, 2);
            }
            const __m256i q = _mm256_or_si256(lo, _mm256_and_si256(hi, m2));
            for (int i = 0; i < R; ++i) {
              const __m256i x = _mm256_maddubs_epi16(q, bcast_i32(ab[i] + a_off + 4 * t));
              p[i] = u == 0 ? x : _mm256_add_epi16(p[i], x);
              keep_reg(p[i]);
            }
          }
          for (int i = 0; i < R; ++i) isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(p[i], sc));
        }
      }
    }
    const __m256 d8 = load_f16x8(gb + offsetof(BlockQ6_Kx8, d));
    __m256i sp[8];  // the scales of sub-blocks 2q and 2q + 1, once for every act row
    for (int q = 0; q < 8; ++q) sp[q] = signed_scale_two(scales + 16 * q, scales + 16 * q + 8);
    for (int i = 0; i < R; ++i) {
      int16_t bs[16];
      std::memcpy(bs, ab[i] + offsetof(BlockQ8_K, bsums), sizeof bs);
      __m256i off = _mm256_setzero_si256();
      for (int j = 0; j < 16; j += 2) {
        const auto s0 = static_cast<uint16_t>(bs[j]), s1 = static_cast<uint16_t>(bs[j + 1]);
        const __m256i act = _mm256_set1_epi32(static_cast<int32_t>(s0 | (static_cast<uint32_t>(s1) << 16)));
        off = _mm256_add_epi32(off, _mm256_madd_epi16(sp[j / 2], act));
      }
      const __m256i scaled = _mm256_sub_epi32(isum[i], _mm256_slli_epi32(off, 5));
      float da;
      std::memcpy(&da, ab[i] + offsetof(BlockQ8_K, d), 4);
      const __m256 r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(scaled), _mm256_mul_ps(d8, _mm256_set1_ps(da)),
                                       _mm256_load_ps(acc[i]));
      _mm256_store_ps(acc[i], r);
    }
  }
  for (int i = 0; i < R; ++i) store_lanes(y + static_cast<size_t>(i) * y_stride, _mm256_load_ps(acc[i]), rows);
}

template <int N>
void q6_k_x8_rest(int64_t n, const uint8_t* group, const uint8_t* a, size_t a_stride, int64_t nb, float* y,
                  size_t y_stride, int rows, const uint8_t* pf) {
  if constexpr (N > 0) {
    if (n == N) {
      q6_k_x8_micro<N>(group, a, a_stride, nb, y, y_stride, rows, pf);
    } else {
      q6_k_x8_rest<N - 1>(n, group, a, a_stride, nb, y, y_stride, rows, pf);
    }
  }
}

}  // namespace

void tile_x8_q4_k(const MatmulTile& t) { tile_x8_k<q4_k_x8_micro<4>, q4_k_x8_rest<3>>(t); }
void tile_x8_q5_k(const MatmulTile& t) { tile_x8_k<q4_k_x8_micro<4, true>, q4_k_x8_rest<3, true>>(t); }
void tile_x8_q6_k(const MatmulTile& t) { tile_x8_k<q6_k_x8_micro<4>, q6_k_x8_rest<3>>(t); }

void tile_q4_k(const MatmulTile& t) { tile_k<4>(t); }
void tile_q5_k(const MatmulTile& t) { tile_k<5>(t); }
void tile_q6_k(const MatmulTile& t) { tile_k<6>(t); }
void tile_q2_k(const MatmulTile& t) { tile_k<2>(t); }
void tile_q3_k(const MatmulTile& t) { tile_k<3>(t); }

}  // namespace metro::kernels::avx2
