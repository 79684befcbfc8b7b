// Helpers shared by the K-quant x8 kernels (matmul_k_avx2.cpp, matmul_k_low_avx2.cpp;
// internal, AVX2 translation units only). Layouts: repack.h.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/kernel_table.h"
#include "kernels/quant_blocks.h"
#include "kernels/repack.h"
#include "kernels/simd_avx2.h"

namespace metro::kernels::avx2 {

// A sub-block's 8 scale bytes (one per row) as 32-bit lanes holding the byte in both
// 16-bit halves.
inline __m256i scale_pairs(const uint8_t* bytes8) {
  const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes8)));
  return _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
}

// Two sub-blocks' 8 min bytes as 32-bit lanes: sub-block j in the low half, j + 1 high.
inline __m256i min_pairs(const uint8_t* lo8, const uint8_t* hi8) {
  const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(lo8)));
  const __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(hi8)));
  return _mm256_or_si256(lo, _mm256_slli_epi32(hi, 16));
}

template <class V>
inline void keep_reg(V& v) {
  __asm__("" : "+x"(v));
}

// A sub-block's 8 signed scale bytes as 32-bit lanes holding the scale in both halves.
inline __m256i signed_scale_pairs(const int8_t* bytes8) {
  const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes8)));
  return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16));
}

// Sub-blocks j and j + 1's signed scales as 32-bit lanes: j low, j + 1 high.
inline __m256i signed_scale_two(const int8_t* lo8, const int8_t* hi8) {
  const __m256i lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(lo8)));
  const __m256i hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(hi8)));
  return _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(hi, 16));
}

// The group loop of the K-quant x8 kernels: 4 act rows per micro tile, the first pass over
// a group prefetching the next.
template <void (*kMicro4)(const uint8_t*, const uint8_t*, size_t, int64_t, float*, size_t, int, const uint8_t*),
          void (*kRest)(int64_t, const uint8_t*, const uint8_t*, size_t, int64_t, float*, size_t, int,
                        const uint8_t*)>
void tile_x8_k(const MatmulTile& t) {
  constexpr int R = 4;
  const int64_t nb = t.k / kQKK;
  const int64_t groups = (t.n_rows + kX8Rows - 1) / kX8Rows;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* group = t.w + static_cast<size_t>(g) * t.w_stride;
    const int rows = static_cast<int>(std::min<int64_t>(kX8Rows, t.n_rows - g * kX8Rows));
    float* yg = t.y + g * kX8Rows;
    const uint8_t* pf = g + 1 < groups ? group + t.w_stride : nullptr;
    int64_t i = 0;
    for (; i + R <= t.n_acts; i += R) {
      kMicro4(group, t.a + static_cast<size_t>(i) * t.a_stride, t.a_stride, nb, yg + static_cast<size_t>(i) * t.y_stride,
              t.y_stride, rows, pf);
      pf = nullptr;
    }
    kRest(t.n_acts - i, group, t.a + static_cast<size_t>(i) * t.a_stride, t.a_stride, nb,
          yg + static_cast<size_t>(i) * t.y_stride, t.y_stride, rows, pf);
  }
}

// Runs Micro::run<n> for the n (0..N) act rows a group has left after its 4-row tiles.
template <class Micro, int N>
void x8_rest(int64_t n, const uint8_t* group, const uint8_t* a, size_t a_stride, int64_t nb, float* y,
             size_t y_stride, int rows, const uint8_t* pf) {
  if constexpr (N > 0) {
    if (n == N) {
      Micro::template run<N>(group, a, a_stride, nb, y, y_stride, rows, pf);
    } else {
      x8_rest<Micro, N - 1>(n, group, a, a_stride, nb, y, y_stride, rows, pf);
    }
  }
}

// Touches the cache lines of group block b (kS bytes each) of the next group.
inline void prefetch_group_block(const uint8_t* pf, int64_t b, int64_t kS) {
  if (pf == nullptr) return;
  for (int64_t off = (b * kS) & ~int64_t{63}; off < (b + 1) * kS; off += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(pf + off), _MM_HINT_T0);
  }
}

}  // namespace metro::kernels::avx2
