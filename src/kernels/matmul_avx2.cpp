// AVX2 kernels for the 32-block weight formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), in the x8
// interleaved layout (repack.h) and row-major, and the AVX2 kernel table.
//
// Per output element, both layouts compute, block after block:
//   isum = exact integer sum of (weight quant) * (act quant) over the block
//          (Q4_0/Q5_0: unsigned quants, minus 8 or 16 times the act block's quant sum)
//   acc  = fma(float(isum), dw * da, acc)        then, for Q4_1/Q5_1:
//   acc  = fma(mw, s_a, acc)
// with one SIMD lane per weight row. The x8 layout gets the 8 rows' integer sums directly
// in the lanes (an act's 4 bytes broadcast against 4 bytes of each row); the row-major
// kernels get per-row partial vectors and fold them into lanes (reduce8_epi32). So the two
// layouts, any tile shape and any thread split give identical bits.
//
// Integer ranges: 4-bit quants times |act| <= 127 make 16-bit pair sums <= 3810, so eight
// maddubs results add in 16 bits (<= 30480); 5-bit ones only four (<= 31496). Q8_0 weights
// use the sign trick (|w| times sign-adjusted act), whose pairs (<= 32258) go straight to
// 32 bits.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "base/check.h"
#include "kernels/kernels_avx2.h"
#include "kernels/matmul.h"
#include "kernels/quant_blocks.h"
#include "kernels/repack.h"
#include "kernels/simd_avx2.h"

namespace metro::kernels {

namespace avx2 {
namespace {

inline __m256i maddubs_sum(__m256i p) { return _mm256_madd_epi16(p, _mm256_set1_epi16(1)); }

// The fifth bits of element group g (elements 4g..4g+3 of each row) from the transposed
// qh word: bit g of each byte, moved to bit 4.
inline __m256i fifth_bits(__m256i qh, int g) {
  const __m256i v = g <= 4 ? _mm256_sll_epi16(qh, _mm_cvtsi32_si128(4 - g))
                           : _mm256_srl_epi16(qh, _mm_cvtsi32_si128(g - 4));
  return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

// ---- Format policies -----------------------------------------------------------------
// x8_isums<F, R>(group block, act quant pointers) -> R vectors of 8 exact block sums.
// row_values<F>(row block) -> the 32 weight values as bytes (unsigned; signed for Q8_0).

struct Q4_0Fmt {
  using Group = BlockQ4_0x8;
  using Row = BlockQ4_0;
  using Act = BlockQ8_0;
  static constexpr int kOffset = 8;
  static constexpr bool kMin = false;
  static constexpr bool kSigned = false;
};
struct Q4_1Fmt {
  using Group = BlockQ4_1x8;
  using Row = BlockQ4_1;
  using Act = BlockQ8_1;
  static constexpr int kOffset = 0;
  static constexpr bool kMin = true;
  static constexpr bool kSigned = false;
};
struct Q5_0Fmt {
  using Group = BlockQ5_0x8;
  using Row = BlockQ5_0;
  using Act = BlockQ8_0;
  static constexpr int kOffset = 16;
  static constexpr bool kMin = false;
  static constexpr bool kSigned = false;
};
struct Q5_1Fmt {
  using Group = BlockQ5_1x8;
  using Row = BlockQ5_1;
  using Act = BlockQ8_1;
  static constexpr int kOffset = 0;
  static constexpr bool kMin = true;
  static constexpr bool kSigned = false;
};
struct Q8_0Fmt {
  using Group = BlockQ8_0x8;
  using Row = BlockQ8_0;
  using Act = BlockQ8_0;
  static constexpr int kOffset = 0;
  static constexpr bool kMin = false;
  static constexpr bool kSigned = true;
};

template <class Act>
constexpr size_t act_qs_offset() {
  return offsetof(Act, qs);
}

template <class F>
constexpr bool is_5bit() {
  return std::is_same_v<F, Q5_0Fmt> || std::is_same_v<F, Q5_1Fmt>;
}

// Keeps v in a register as computed here: stops the compiler from reassociating a chain
// of additions into a wide tree of live temporaries (which spills on 16 registers).
template <class V>
inline void keep(V& v) {
  __asm__("" : "+x"(v));
}

template <class F, int R>
inline void x8_isums(const uint8_t* gb, const uint8_t* const aq[R], __m256i out[R]) {
  if constexpr (std::is_same_v<F, Q8_0Fmt>) {
    const uint8_t* qs = gb + offsetof(BlockQ8_0x8, qs);
    for (int i = 0; i < R; ++i) out[i] = _mm256_setzero_si256();
    for (int g = 0; g < 8; ++g) {
      const __m256i w = load256(qs + 32 * g);
      const __m256i aw = _mm256_sign_epi8(w, w);
      for (int i = 0; i < R; ++i) {
        const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(bcast_i32(aq[i] + 4 * g), w));
        out[i] = _mm256_add_epi32(out[i], maddubs_sum(p));
        keep(out[i]);
      }
    }
  } else {
    const uint8_t* qs = gb + offsetof(typename F::Group, qs);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (is_5bit<F>()) qh = load256(gb + offsetof(typename F::Group, qh));
    __m256i p[R];
    for (int i = 0; i < R; ++i) {
      p[i] = _mm256_setzero_si256();
      out[i] = _mm256_setzero_si256();
    }
    // keep() holds each act row's 16-bit sums as one chain of adds (plain adds: on Zen 3,
    // saturating ones share the two multiply pipes with maddubs).
    for (int t = 0; t < 4; ++t) {
      const __m256i w = load256(qs + 32 * t);
      __m256i lo = _mm256_and_si256(w, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
      if constexpr (is_5bit<F>()) {
        lo = _mm256_or_si256(lo, fifth_bits(qh, t));
        hi = _mm256_or_si256(hi, fifth_bits(qh, t + 4));
      }
      for (int i = 0; i < R; ++i) {
        p[i] = _mm256_add_epi16(p[i], _mm256_maddubs_epi16(lo, bcast_i32(aq[i] + 4 * t)));
        keep(p[i]);
        p[i] = _mm256_add_epi16(p[i], _mm256_maddubs_epi16(hi, bcast_i32(aq[i] + 16 + 4 * t)));
        keep(p[i]);
      }
      if (is_5bit<F>() && t == 1) {  // four maddubs per 16-bit lane so far: flush
        for (int i = 0; i < R; ++i) {
          out[i] = maddubs_sum(p[i]);
          p[i] = _mm256_setzero_si256();
        }
      }
    }
    for (int i = 0; i < R; ++i) out[i] = _mm256_add_epi32(out[i], maddubs_sum(p[i]));
  }
}

// Where a tile's act rows and their per-block data are.
struct ActRows {
  const uint8_t* a;
  size_t stride;
  const float* d;
  const float* s;
  const int32_t* sums;
  int64_t nb;  // blocks per row (stride of the side arrays)

  ActRows from(int64_t i) const {
    const int64_t o = i * nb;
    return {a + static_cast<size_t>(i) * stride, stride, d + o, s ? s + o : nullptr, sums ? sums + o : nullptr, nb};
  }
};

ActRows act_rows(const MatmulTile& t) { return {t.a, t.a_stride, t.a_d, t.a_s, t.a_sums, t.k / kQK}; }

// Adds block b's contribution for act row i (the recipe in the file comment).
template <class F>
inline __m256 combine(__m256i isum, __m256 d8, __m256 m8, const ActRows& a, int64_t i, int64_t b, __m256 acc) {
  const int64_t at = i * a.nb + b;
  if constexpr (F::kOffset != 0) {
    constexpr int kShift = F::kOffset == 8 ? 3 : 4;
    isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(_mm256_set1_epi32(a.sums[at]), kShift));
  }
  const __m256 scale = _mm256_mul_ps(d8, _mm256_broadcast_ss(a.d + at));
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc);
  if constexpr (F::kMin) acc = _mm256_fmadd_ps(m8, _mm256_broadcast_ss(a.s + at), acc);
  return acc;
}

// One 8-row group times R act rows, over the whole of k. With `pf`, also prefetches the
// group at pf (the next one) a block at a time, so its bytes are on their way from memory
// while this group computes.
template <class F, int R>
void x8_micro(const uint8_t* group, const ActRows& a, float* y, size_t y_stride, int rows,
              const uint8_t* pf = nullptr) {
  using Act = typename F::Act;
  constexpr int64_t kS = static_cast<int64_t>(sizeof(typename F::Group));
  __m256 acc[R];
  for (int i = 0; i < R; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    if (pf != nullptr) {
      for (int64_t off = (b * kS) & ~int64_t{63}; off < (b + 1) * kS; off += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(pf + off), _MM_HINT_T0);
      }
    }
    const uint8_t* gb = group + b * kS;
    const uint8_t* aq[R];
    for (int i = 0; i < R; ++i) {
      aq[i] = a.a + static_cast<size_t>(i) * a.stride + static_cast<size_t>(b) * sizeof(Act) + act_qs_offset<Act>();
    }
    __m256i isum[R];
    x8_isums<F, R>(gb, aq, isum);
    const __m256 d8 = load_f16x8(gb);
    __m256 m8 = _mm256_setzero_ps();
    if constexpr (F::kMin) m8 = load_f16x8(gb + 16);
    for (int i = 0; i < R; ++i) acc[i] = combine<F>(isum[i], d8, m8, a, i, b, acc[i]);
  }
  for (int i = 0; i < R; ++i) store_lanes(y + static_cast<size_t>(i) * y_stride, acc[i], rows);
}

// Act rows per register tile: 4 keeps the 16-bit sums, the float accumulators and one
// weight vector in 16 registers (3, 5 and 6 measured no better on Zen 3).
constexpr int kX8TileActs = 4;

// 4-bit formats (Q4_0, Q4_1): two 8-row groups times R act rows. A broadcast of an act's
// 4 bytes costs a vector-pipe slot like a multiply does (it is not a pure load on Zen 3),
// so feeding each broadcast to both groups' weight vectors cuts the slots per byte product
// from about 4.4 to 3.7. Per output the integer block sums are exact and the float steps
// are those of x8_micro in the same order, so the bits are the same.
template <class F>
constexpr bool kPairGroups = !is_5bit<F>() && !std::is_same_v<F, Q8_0Fmt>;
constexpr int kX8PairActs = 4;  // 3, 5 and 6 measured the same

template <class F, int R>
void x8_micro2(const uint8_t* g0, size_t g_stride, const ActRows& a, float* y, size_t y_stride, int rows1,
               const uint8_t* pf) {
  using Act = typename F::Act;
  constexpr int64_t kS = static_cast<int64_t>(sizeof(typename F::Group));
  const uint8_t* g1 = g0 + g_stride;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  alignas(32) float acc[2][R][8];
  for (int i = 0; i < R; ++i) {
    _mm256_store_ps(acc[0][i], _mm256_setzero_ps());
    _mm256_store_ps(acc[1][i], _mm256_setzero_ps());
  }
  for (int64_t b = 0; b < a.nb; ++b) {
    if (pf != nullptr) {
      for (int64_t off = (b * kS) & ~int64_t{63}; off < (b + 1) * kS; off += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(pf + off), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(pf + g_stride + off), _MM_HINT_T0);
      }
    }
    const uint8_t* b0 = g0 + b * kS;
    const uint8_t* b1 = g1 + b * kS;
    const uint8_t* aq[R];
    for (int i = 0; i < R; ++i) {
      aq[i] = a.a + static_cast<size_t>(i) * a.stride + static_cast<size_t>(b) * sizeof(Act) + act_qs_offset<Act>();
    }
    const uint8_t* q0 = b0 + offsetof(typename F::Group, qs);
    const uint8_t* q1 = b1 + offsetof(typename F::Group, qs);
    __m256i p0[R], p1[R];
    for (int t = 0; t < 4; ++t) {
      const __m256i w0 = load256(q0 + 32 * t);
      const __m256i w1 = load256(q1 + 32 * t);
      const __m256i lo0 = _mm256_and_si256(w0, m4), hi0 = _mm256_and_si256(_mm256_srli_epi16(w0, 4), m4);
      const __m256i lo1 = _mm256_and_si256(w1, m4), hi1 = _mm256_and_si256(_mm256_srli_epi16(w1, 4), m4);
      for (int i = 0; i < R; ++i) {
        const __m256i al = bcast_i32(aq[i] + 4 * t);
        const __m256i x0 = _mm256_maddubs_epi16(lo0, al), x1 = _mm256_maddubs_epi16(lo1, al);
        p0[i] = t == 0 ? x0 : _mm256_add_epi16(p0[i], x0);
        p1[i] = t == 0 ? x1 : _mm256_add_epi16(p1[i], x1);
        keep(p0[i]);
        keep(p1[i]);
        const __m256i ah = bcast_i32(aq[i] + 16 + 4 * t);
        p0[i] = _mm256_add_epi16(p0[i], _mm256_maddubs_epi16(hi0, ah));
        p1[i] = _mm256_add_epi16(p1[i], _mm256_maddubs_epi16(hi1, ah));
        keep(p0[i]);
        keep(p1[i]);
      }
    }
    const __m256 d0 = load_f16x8(b0), d1 = load_f16x8(b1);
    __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
    if constexpr (F::kMin) {
      m0 = load_f16x8(b0 + 16);
      m1 = load_f16x8(b1 + 16);
    }
    for (int i = 0; i < R; ++i) {
      _mm256_store_ps(acc[0][i], combine<F>(maddubs_sum(p0[i]), d0, m0, a, i, b, _mm256_load_ps(acc[0][i])));
      _mm256_store_ps(acc[1][i], combine<F>(maddubs_sum(p1[i]), d1, m1, a, i, b, _mm256_load_ps(acc[1][i])));
    }
  }
  for (int i = 0; i < R; ++i) {
    store_lanes(y + static_cast<size_t>(i) * y_stride, _mm256_load_ps(acc[0][i]), kX8Rows);
    store_lanes(y + static_cast<size_t>(i) * y_stride + kX8Rows, _mm256_load_ps(acc[1][i]), rows1);
  }
}

template <class F, int N>
void x8_rest2(int64_t n, const uint8_t* g0, size_t g_stride, const ActRows& a, float* y, size_t y_stride, int rows1,
              const uint8_t* pf) {
  if constexpr (N > 0) {
    if (n == N) {
      x8_micro2<F, N>(g0, g_stride, a, y, y_stride, rows1, pf);
    } else {
      x8_rest2<F, N - 1>(n, g0, g_stride, a, y, y_stride, rows1, pf);
    }
  }
}

// The last n < R act rows of a tile.
template <class F, int N>
void x8_rest(int64_t n, const uint8_t* group, const ActRows& a, float* y, size_t y_stride, int rows,
             const uint8_t* pf) {
  if constexpr (N > 0) {
    if (n == N) {
      x8_micro<F, N>(group, a, y, y_stride, rows, pf);
    } else {
      x8_rest<F, N - 1>(n, group, a, y, y_stride, rows, pf);
    }
  }
}

template <class F>
void tile_x8(const MatmulTile& t) {
  constexpr int R = kX8TileActs;
  const ActRows a = act_rows(t);
  const int64_t groups = (t.n_rows + kX8Rows - 1) / kX8Rows;
  int64_t g = 0;
  // Pairs pay where arithmetic bounds the tile; a GEMV of a few act rows streams its weights,
  // and the one-group order prefetches them better.
  if (kPairGroups<F> && t.n_acts >= kX8PairActs) {
    for (; g + 2 <= groups; g += 2) {
      const uint8_t* group = t.w + static_cast<size_t>(g) * t.w_stride;
      const int rows1 = static_cast<int>(std::min<int64_t>(kX8Rows, t.n_rows - (g + 1) * kX8Rows));
      float* yg = t.y + g * kX8Rows;
      const uint8_t* pf = g + 3 < groups ? group + 2 * t.w_stride : nullptr;
      int64_t i = 0;
      constexpr int R2 = kX8PairActs;
      for (; i + R2 <= t.n_acts; i += R2) {
        x8_micro2<F, R2>(group, t.w_stride, a.from(i), yg + i * t.y_stride, t.y_stride, rows1, pf);
        pf = nullptr;
      }
      x8_rest2<F, R2 - 1>(t.n_acts - i, group, t.w_stride, a.from(i), yg + i * t.y_stride, t.y_stride, rows1, pf);
    }
  }
  for (; g < groups; ++g) {
    const uint8_t* group = t.w + static_cast<size_t>(g) * t.w_stride;
    const int rows = static_cast<int>(std::min<int64_t>(kX8Rows, t.n_rows - g * kX8Rows));
    float* yg = t.y + g * kX8Rows;
    // The first pass over this group's bytes also fetches the next group's.
    const uint8_t* pf = g + 1 < groups ? group + t.w_stride : nullptr;
    int64_t i = 0;
    for (; i + R <= t.n_acts; i += R) {
      x8_micro<F, R>(group, a.from(i), yg + i * t.y_stride, t.y_stride, rows, pf);
      pf = nullptr;
    }
    x8_rest<F, R - 1>(t.n_acts - i, group, a.from(i), yg + i * t.y_stride, t.y_stride, rows, pf);
  }
}

// ---- Row-major: 8 rows at a time, per-row partial sums folded into lanes. --------------

// The 32 quants of a row-major block as bytes, read straight from the row (copying the
// block to the stack first would cost a failed store-to-load forward per row).
template <class F>
inline __m256i row_values(const uint8_t* blk) {
  using Row = typename F::Row;
  if constexpr (std::is_same_v<F, Q8_0Fmt>) {
    return load256(blk + offsetof(Row, qs));
  } else {
    __m256i v = unpack_nibbles32(blk + offsetof(Row, qs));
    if constexpr (is_5bit<F>()) {
      uint32_t qh;
      std::memcpy(&qh, blk + offsetof(Row, qh), 4);
      v = _mm256_or_si256(v, expand_bits_to_0x10(qh));
    }
    return v;
  }
}

template <class F>
void tile_row_major(const MatmulTile& t) {
  using Row = typename F::Row;
  using Act = typename F::Act;
  METRO_CHECK(t.n_acts <= kMaxTileActs);
  const ActRows a = act_rows(t);
  __m256 acc[kMaxTileActs];
  for (int64_t g0 = 0; g0 < t.n_rows; g0 += kX8Rows) {
    const int rows = static_cast<int>(std::min<int64_t>(kX8Rows, t.n_rows - g0));
    const uint8_t* wr[8];
    for (int r = 0; r < 8; ++r) wr[r] = t.w + static_cast<size_t>(g0 + std::min(r, rows - 1)) * t.w_stride;
    for (int64_t i = 0; i < t.n_acts; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < a.nb; ++b) {
      __m256i wv[8], wabs[8] = {};
      alignas(16) uint16_t dh[8], mh[8];
      for (int r = 0; r < 8; ++r) {
        const uint8_t* blk = wr[r] + static_cast<size_t>(b) * sizeof(Row);
        wv[r] = row_values<F>(blk);
        if constexpr (F::kSigned) wabs[r] = _mm256_sign_epi8(wv[r], wv[r]);
        std::memcpy(&dh[r], blk + offsetof(Row, d), 2);
        if constexpr (F::kMin) std::memcpy(&mh[r], blk + offsetof(Row, m), 2);
      }
      const __m256 d8 = load_f16x8(dh);
      __m256 m8 = _mm256_setzero_ps();
      if constexpr (F::kMin) m8 = load_f16x8(mh);
      for (int64_t i = 0; i < t.n_acts; ++i) {
        const __m256i aq = load256(a.a + static_cast<size_t>(i) * a.stride + static_cast<size_t>(b) * sizeof(Act) +
                                   act_qs_offset<Act>());
        __m256i v[8];
        for (int r = 0; r < 8; ++r) {
          if constexpr (F::kSigned) {
            v[r] = maddubs_sum(_mm256_maddubs_epi16(wabs[r], _mm256_sign_epi8(aq, wv[r])));
          } else {
            v[r] = maddubs_sum(_mm256_maddubs_epi16(wv[r], aq));
          }
        }
        acc[i] = combine<F>(reduce8_epi32(v), d8, m8, a, i, b, acc[i]);
      }
    }
    for (int64_t i = 0; i < t.n_acts; ++i) store_lanes(t.y + static_cast<size_t>(i) * t.y_stride + g0, acc[i], rows);
  }
}

KernelTable make_table() {
  KernelTable t = scalar_kernels();
  t.isa = "avx2";
  auto idx = [](DType d) { return static_cast<int>(d); };
  t.quantize_row[idx(DType::kQ8_0)] = quantize_row_q8_0;
  t.quantize_row[idx(DType::kQ8_1)] = quantize_row_q8_1;
  t.quantize_row[idx(DType::kQ8_K)] = quantize_row_q8_k;
  t.tile_x8[idx(DType::kQ4_0)] = tile_x8<Q4_0Fmt>;
  t.tile_x8[idx(DType::kQ4_1)] = tile_x8<Q4_1Fmt>;
  t.tile_x8[idx(DType::kQ5_0)] = tile_x8<Q5_0Fmt>;
  t.tile_x8[idx(DType::kQ5_1)] = tile_x8<Q5_1Fmt>;
  t.tile_x8[idx(DType::kQ8_0)] = tile_x8<Q8_0Fmt>;
  t.tile_row_major[idx(DType::kQ4_0)] = tile_row_major<Q4_0Fmt>;
  t.tile_row_major[idx(DType::kQ4_1)] = tile_row_major<Q4_1Fmt>;
  t.tile_row_major[idx(DType::kQ5_0)] = tile_row_major<Q5_0Fmt>;
  t.tile_row_major[idx(DType::kQ5_1)] = tile_row_major<Q5_1Fmt>;
  t.tile_row_major[idx(DType::kQ8_0)] = tile_row_major<Q8_0Fmt>;
  t.tile_row_major[idx(DType::kF32)] = tile_f32;
  t.tile_row_major[idx(DType::kF16)] = tile_f16;
  t.tile_x8[idx(DType::kF16)] = tile_x8_f16;
  t.tile_row_major[idx(DType::kBF16)] = tile_bf16;
  t.tile_row_major[idx(DType::kQ4_K)] = tile_q4_k;
  t.tile_x8[idx(DType::kQ4_K)] = tile_x8_q4_k;
  t.tile_x8[idx(DType::kQ5_K)] = tile_x8_q5_k;
  t.tile_x8[idx(DType::kQ6_K)] = tile_x8_q6_k;
  t.tile_row_major[idx(DType::kQ5_K)] = tile_q5_k;
  t.tile_row_major[idx(DType::kQ6_K)] = tile_q6_k;
  t.tile_row_major[idx(DType::kQ2_K)] = tile_q2_k;
  t.tile_row_major[idx(DType::kQ3_K)] = tile_q3_k;
  t.tile_x8[idx(DType::kQ2_K)] = tile_x8_q2_k;
  t.tile_x8[idx(DType::kQ3_K)] = tile_x8_q3_k;
  return t;
}

}  // namespace
}  // namespace avx2

const KernelTable& avx2_table() {
  static const KernelTable table = avx2::make_table();
  return table;
}

}  // namespace metro::kernels
