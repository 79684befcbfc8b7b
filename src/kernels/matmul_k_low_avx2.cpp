// AVX2 kernels for Q2_K and Q3_K in the x8 interleaved layout (repack.h) times Q8_K
// activations.
//
// One SIMD lane per weight row, as the other x8 kernels. Vector v = 4h + s of a
// super-block holds elements 128h + 32s .. + 31: their 2-bit fields are bits 2s..2s+1 of
// qs words 8h + t (t = 0..7, four elements each), Q3_K's third bits bit v of hmask word t;
// words 0-3 are sub-block 2v, words 4-7 sub-block 2v + 1. Four maddubs of 2-bit (3-bit)
// quants fill a 16-bit pair sum (<= 3048; <= 7112), which meets the lane's sub-block
// scale in one madd. Q2_K's mins go against the act's 16-sums; Q3_K's quants are taken
// unsigned (0..7) and the - 4 comes off with the 16-sums, as tile_k<3> does. The integers
// equal the row-major kernels' per output and the float steps are the same, so both
// layouts give the same bits.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <utility>

#include "base/check.h"
#include "kernels/kernels_avx2.h"
#include "kernels/matmul_k_x8_avx2.h"

namespace metro::kernels::avx2 {

namespace {

// Field S (0..3) of every byte: bits 2S..2S+1. Odd fields stay in place (4x their value,
// which keeps a 16-bit sum of four maddubs in range: 4 * 2 * 28 * 127 < 2^15 for Q3_K) and
// are summed apart, then divided by 4 exactly: one shift less per field.
template <int S>
inline __m256i field(__m256i w) {
  const __m256i lo = S < 2 ? w : _mm256_srli_epi16(w, 4);
  return _mm256_and_si256(lo, _mm256_set1_epi8(S % 2 == 0 ? 0x03 : 0x0C));
}

// Q3_K's third bit of vector V = 4h + s from its hmask byte (bit V), placed above field s
// as field<s> leaves it: bit 2 for even s, bit 4 for odd s.
template <int V>
inline __m256i third_bit(__m256i hm) {
  constexpr int kTo = V % 2 == 0 ? 2 : 4;
  __m256i v;
  if constexpr (V < kTo) {
    v = _mm256_slli_epi16(hm, kTo - V);
  } else if constexpr (V == kTo) {
    v = hm;
  } else {
    v = _mm256_srli_epi16(hm, V - kTo);
  }
  return _mm256_and_si256(v, _mm256_set1_epi8(static_cast<char>(1 << kTo)));
}

// The 16 bytes of sub-blocks 2q and 2q + 1 (8 rows each) in both 128-bit halves.
inline __m256i scale_bytes(const uint8_t* p16) { return _mm256_broadcastsi128_si256(load128(p16)); }

// Shuffle control: 32-bit lane r takes byte `a` + r into its low 16-bit half and byte
// `b` + r into its high one, at bit `at` (0 or 8; the other byte zero).
struct alignas(32) LaneCtrl {
  int8_t c[32];
};
constexpr LaneCtrl lane_ctrl(int a, int b, int at) {
  LaneCtrl l{};
  for (int r = 0; r < 8; ++r) {
    for (int half = 0; half < 2; ++half) {
      const int src = (half == 0 ? a : b) + r;
      l.c[4 * r + 2 * half] = static_cast<int8_t>(at == 0 ? src : -1);
      l.c[4 * r + 2 * half + 1] = static_cast<int8_t>(at == 0 ? -1 : src);
    }
  }
  return l;
}
// [format][0: sub-block 2q, 1: 2q + 1, 2: both (2q low, 2q + 1 high)]
constexpr LaneCtrl kCtrl[2][3] = {{lane_ctrl(0, 0, 0), lane_ctrl(8, 8, 0), lane_ctrl(0, 8, 0)},
                                  {lane_ctrl(0, 0, 8), lane_ctrl(8, 8, 8), lane_ctrl(0, 8, 8)}};

inline __m256i ctrl(bool q3, int which) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(kCtrl[q3][which].c)); }

// Sub-block 2q + k's scale per row as a 16-bit pair for madd (bytes: scale_bytes(q)).
// Q2_K: the low nibble; Q3_K: the signed byte.
template <bool kQ3>
inline __m256i scale_pair(__m256i bytes, int k) {
  const __m256i v = _mm256_shuffle_epi8(bytes, ctrl(kQ3, k));
  return kQ3 ? _mm256_srai_epi16(v, 8) : _mm256_and_si256(v, _mm256_set1_epi16(0x0F));
}

// Sub-blocks 2q (low half) and 2q + 1 (high half) per row: Q2_K's mins (high nibbles),
// Q3_K's signed scales.
template <bool kQ3>
inline __m256i side_pair(__m256i bytes) {
  const __m256i v = _mm256_shuffle_epi8(bytes, ctrl(kQ3, 2));
  return kQ3 ? _mm256_srai_epi16(v, 8) : _mm256_srli_epi16(v, 4);
}

template <bool kQ3>
struct LowK {
  using G = std::conditional_t<kQ3, BlockQ3_Kx8, BlockQ2_Kx8>;
  static constexpr int kActQs = static_cast<int>(offsetof(BlockQ8_K, qs));

  // Field kS of qs word 8kH + t, with its third bit for Q3_K.
  template <int kH, int kS>
  static __m256i quants(__m256i w, __m256i hm) {
    __m256i q = field<kS>(w);
    if constexpr (kQ3) q = _mm256_or_si256(q, third_bit<4 * kH + kS>(hm));
    return q;
  }

  // Vector V of a super-block against every act row, each word's field built per vector
  // (many act rows share each build). isum[1]: the odd fields' sums (4x).
  template <int V, int R>
  static void vector_sums(const uint8_t* gb, const uint8_t* const* ab, __m256i (*isum)[R]) {
    constexpr int kH = V / 4, kS = V % 4;
    const uint8_t* qs = gb + offsetof(G, qs);
    const __m256i bytes = scale_bytes(gb + offsetof(G, scales) + 16 * V);
    #pragma GCC unroll 8
    for (int half = 0; half < 2; ++half) {
      const __m256i sc = scale_pair<kQ3>(bytes, half);
      __m256i p[R];
      #pragma GCC unroll 8
      for (int u = 0; u < 4; ++u) {
        const int t = 4 * half + u;
        const __m256i hm = kQ3 ? load256(gb + offsetof(BlockQ3_Kx8, hmask) + 32 * t) : _mm256_setzero_si256();
        const __m256i q = quants<kH, kS>(load256(qs + 32 * (8 * kH + t)), hm);
        #pragma GCC unroll 8
        for (int i = 0; i < R; ++i) {
          const __m256i x = _mm256_maddubs_epi16(q, bcast_i32(ab[i] + kActQs + 32 * V + 4 * t));
          p[i] = u == 0 ? x : _mm256_add_epi16(p[i], x);
          keep_reg(p[i]);
        }
      }
      #pragma GCC unroll 8
      for (int i = 0; i < R; ++i) isum[kS % 2][i] = _mm256_add_epi32(isum[kS % 2][i], _mm256_madd_epi16(p[i], sc));
    }
  }

  // Half kH of a super-block for one or two act rows: each qs (and hmask) word is read
  // once and its four vectors' fields built together.
  template <int kH, int R>
  static void half_sums_words_once(const uint8_t* gb, const uint8_t* const* ab, __m256i (*isum)[R]) {
    const uint8_t* qs = gb + offsetof(G, qs);
    #pragma GCC unroll 8
    for (int half = 0; half < 2; ++half) {
      __m256i p[4][R];
      #pragma GCC unroll 8
      for (int u = 0; u < 4; ++u) {
        const int t = 4 * half + u;
        const __m256i w = load256(qs + 32 * (8 * kH + t));
        const __m256i hm = kQ3 ? load256(gb + offsetof(BlockQ3_Kx8, hmask) + 32 * t) : _mm256_setzero_si256();
        const __m256i q[4] = {quants<kH, 0>(w, hm), quants<kH, 1>(w, hm), quants<kH, 2>(w, hm), quants<kH, 3>(w, hm)};
        #pragma GCC unroll 8
        for (int s = 0; s < 4; ++s) {
          #pragma GCC unroll 8
          for (int i = 0; i < R; ++i) {
            const __m256i x = _mm256_maddubs_epi16(q[s], bcast_i32(ab[i] + kActQs + 128 * kH + 32 * s + 4 * t));
            p[s][i] = u == 0 ? x : _mm256_add_epi16(p[s][i], x);
            keep_reg(p[s][i]);
          }
        }
      }
      #pragma GCC unroll 8
      for (int s = 0; s < 4; ++s) {
        const __m256i sc = scale_pair<kQ3>(scale_bytes(gb + offsetof(G, scales) + 16 * (4 * kH + s)), half);
        #pragma GCC unroll 8
        for (int i = 0; i < R; ++i) isum[s % 2][i] = _mm256_add_epi32(isum[s % 2][i], _mm256_madd_epi16(p[s][i], sc));
      }
    }
  }

  // A super-block's integer sums to the rows' float accumulators: the sub-block side terms
  // (Q3_K's - 4 per quant, Q2_K's mins) against the act's 16-sums, then the scales.
  template <int R>
  static void finish_block(const uint8_t* gb, const uint8_t* const* ab, __m256i (*isum)[R], float (*acc)[8]) {
    const __m256 d8 = load_f16x8(gb + offsetof(G, d));
    // Per pair of sub-blocks (2q, 2q + 1), once for every act row: Q3_K's scales, Q2_K's mins.
    __m256i pairs[8];
    #pragma GCC unroll 8
    for (int q = 0; q < 8; ++q) pairs[q] = side_pair<kQ3>(scale_bytes(gb + offsetof(G, scales) + 16 * q));
    #pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m256i sums = _mm256_add_epi32(isum[0][i], _mm256_srai_epi32(isum[1][i], 2));
      // The act's 16-sums j and j + 1 are one little-endian 32-bit word: a madd pair.
      const uint8_t* bsums = ab[i] + offsetof(BlockQ8_K, bsums);
      __m256i side = _mm256_setzero_si256();
      #pragma GCC unroll 8
      for (int q = 0; q < 8; ++q) side = _mm256_add_epi32(side, _mm256_madd_epi16(pairs[q], bcast_i32(bsums + 4 * q)));
      float da;
      std::memcpy(&da, ab[i] + offsetof(BlockQ8_K, d), 4);
      const __m256 vda = _mm256_set1_ps(da);
      __m256 r;
      if constexpr (kQ3) {
        const __m256i scaled = _mm256_sub_epi32(sums, _mm256_slli_epi32(side, 2));
        r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(scaled), _mm256_mul_ps(d8, vda), _mm256_load_ps(acc[i]));
      } else {
        const __m256 dm8 = load_f16x8(gb + offsetof(G, dmin));
        r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(d8, vda), _mm256_load_ps(acc[i]));
        r = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(side), _mm256_mul_ps(dm8, vda), r);
      }
      _mm256_store_ps(acc[i], r);
    }
  }

  template <int R>
  static void run(const uint8_t* group, const uint8_t* a, size_t a_stride, int64_t nb, float* y, size_t y_stride,
                  int rows, const uint8_t* pf) {
    constexpr int64_t kS = static_cast<int64_t>(sizeof(G));
    alignas(32) float acc[R][8];
    #pragma GCC unroll 8
    for (int i = 0; i < R; ++i) _mm256_store_ps(acc[i], _mm256_setzero_ps());
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_group_block(pf, b, kS);
      const uint8_t* gb = group + b * kS;
      const uint8_t* ab[R];
      #pragma GCC unroll 8
      for (int i = 0; i < R; ++i) ab[i] = a + static_cast<size_t>(i) * a_stride + static_cast<size_t>(b) * sizeof(BlockQ8_K);
      __m256i isum[2][R];
      #pragma GCC unroll 8
      for (int i = 0; i < R; ++i) isum[0][i] = isum[1][i] = _mm256_setzero_si256();
      if constexpr (R <= 2) {
        half_sums_words_once<0, R>(gb, ab, isum);
        half_sums_words_once<1, R>(gb, ab, isum);
      } else {
        [&]<int... V>(std::integer_sequence<int, V...>) {
          (vector_sums<V, R>(gb, ab, isum), ...);
        }(std::make_integer_sequence<int, 8>{});
      }
      finish_block<R>(gb, ab, isum, acc);
    }
    #pragma GCC unroll 8
    for (int i = 0; i < R; ++i) store_lanes(y + static_cast<size_t>(i) * y_stride, _mm256_load_ps(acc[i]), rows);
  }
  // Vector V's quants for all 8 words of a super-block.
  template <int V>
  static void unpack_vector(const uint8_t* gb, __m256i* out) {
    constexpr int kH = V / 4, kS = V % 4;
    for (int t = 0; t < 8; ++t) {
      const __m256i hm = kQ3 ? load256(gb + offsetof(BlockQ3_Kx8, hmask) + 32 * t) : _mm256_setzero_si256();
      _mm256_store_si256(out + t, quants<kH, kS>(load256(gb + offsetof(G, qs) + 32 * (8 * kH + t)), hm));
    }
  }

  // R act rows against a super-block unpacked by unpack_vector (q[8 * v + t]).
  template <int R>
  static void tile_sums(const __m256i* q, const __m256i* sc, const uint8_t* const* ab, __m256i (*isum)[R]) {
#pragma GCC unroll 8
    for (int v = 0; v < 8; ++v) {
#pragma GCC unroll 8
      for (int half = 0; half < 2; ++half) {
        __m256i p[R];
#pragma GCC unroll 8
        for (int u = 0; u < 4; ++u) {
          const int t = 4 * half + u;
          const __m256i qv = _mm256_load_si256(q + 8 * v + t);
#pragma GCC unroll 8
          for (int i = 0; i < R; ++i) {
            const __m256i x = _mm256_maddubs_epi16(qv, bcast_i32(ab[i] + kActQs + 32 * v + 4 * t));
            p[i] = u == 0 ? x : _mm256_add_epi16(p[i], x);
            keep_reg(p[i]);
          }
        }
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i) isum[v % 2][i] = _mm256_add_epi32(isum[v % 2][i], _mm256_madd_epi16(p[i], sc[2 * v + half]));
      }
    }
  }

  template <int R>
  static void rows_block(const __m256i* q, const __m256i* sc, const uint8_t* gb, const uint8_t* a, size_t a_stride,
                         int64_t b, float (*acc)[8]) {
    const uint8_t* ab[R];
    for (int i = 0; i < R; ++i) ab[i] = a + static_cast<size_t>(i) * a_stride + static_cast<size_t>(b) * sizeof(BlockQ8_K);
    __m256i isum[2][R];
    for (int i = 0; i < R; ++i) isum[0][i] = isum[1][i] = _mm256_setzero_si256();
    tile_sums<R>(q, sc, ab, isum);
    finish_block<R>(gb, ab, isum, acc);
  }

  // Many act rows (a group of 8 weight rows; Q3_K): each super-block is unpacked once (2 KiB
  // of quants) and every act tile reads it, instead of each 4-row tile building every field
  // again. Per row the same integer sums and the same float steps in the same order as run.
  static void run_many(const uint8_t* group, const uint8_t* a, size_t a_stride, int64_t n_acts, int64_t nb, float* y,
                       size_t y_stride, int rows, const uint8_t* pf) {
    constexpr int64_t kS = static_cast<int64_t>(sizeof(G));
    alignas(32) float acc[kMaxTileActs][8];
    for (int64_t i = 0; i < n_acts; ++i) _mm256_store_ps(acc[i], _mm256_setzero_ps());
    alignas(32) __m256i q[64];
    __m256i sc[16];
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_group_block(pf, b, kS);
      const uint8_t* gb = group + b * kS;
      [&]<int... V>(std::integer_sequence<int, V...>) {
        (unpack_vector<V>(gb, q + 8 * V), ...);
      }(std::make_integer_sequence<int, 8>{});
      for (int v = 0; v < 8; ++v) {
        const __m256i bytes = scale_bytes(gb + offsetof(G, scales) + 16 * v);
        sc[2 * v] = scale_pair<kQ3>(bytes, 0);
        sc[2 * v + 1] = scale_pair<kQ3>(bytes, 1);
      }
      int64_t i = 0;
      for (; i + 4 <= n_acts; i += 4) rows_block<4>(q, sc, gb, a + static_cast<size_t>(i) * a_stride, a_stride, b, acc + i);
      const uint8_t* ai = a + static_cast<size_t>(i) * a_stride;
      if (n_acts - i == 3) rows_block<3>(q, sc, gb, ai, a_stride, b, acc + i);
      if (n_acts - i == 2) rows_block<2>(q, sc, gb, ai, a_stride, b, acc + i);
      if (n_acts - i == 1) rows_block<1>(q, sc, gb, ai, a_stride, b, acc + i);
    }
    for (int64_t i = 0; i < n_acts; ++i) store_lanes(y + static_cast<size_t>(i) * y_stride, _mm256_load_ps(acc[i]), rows);
  }
};

}  // namespace

namespace {

// From this many act rows a Q3_K tile unpacks each super-block once for all of them (its
// third bits make a field dear to build: prefill 1.2x on a 1.1B model). Q2_K's fields cost
// a mask or two, less than storing and loading them again: it keeps building them per tile.
constexpr int64_t kManyActs = 8;

template <bool kQ3>
void tile_low_k(const MatmulTile& t) {
  if (!kQ3 || t.n_acts < kManyActs) {
    tile_x8_k<LowK<kQ3>::template run<4>, x8_rest<LowK<kQ3>, 3>>(t);
    return;
  }
  METRO_CHECK(t.n_acts <= kMaxTileActs);
  const int64_t nb = t.k / kQKK;
  const int64_t groups = (t.n_rows + kX8Rows - 1) / kX8Rows;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* group = t.w + static_cast<size_t>(g) * t.w_stride;
    const int rows = static_cast<int>(std::min<int64_t>(kX8Rows, t.n_rows - g * kX8Rows));
    LowK<kQ3>::run_many(group, t.a, t.a_stride, t.n_acts, nb, t.y + g * kX8Rows, t.y_stride, rows,
                        g + 1 < groups ? group + t.w_stride : nullptr);
  }
}

}  // namespace

void tile_x8_q2_k(const MatmulTile& t) { tile_low_k<false>(t); }
void tile_x8_q3_k(const MatmulTile& t) { tile_low_k<true>(t); }

}  // namespace metro::kernels::avx2
