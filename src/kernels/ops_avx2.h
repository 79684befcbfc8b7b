// Internal AVX2+FMA helpers shared by ops_avx2.cpp and attention_avx2.cpp. Include only
// from *_avx2.cpp files: everything here is compiled for AVX2 and must never run on a CPU
// that base/cpu_features did not report as having it.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/simd_avx2.h"

namespace metro::kernels::avx2 {

// e^x on 8 lanes. x = n ln2 + r with n = round(x / ln2) and |r| <= ln2/2 (Cody-Waite split
// of ln2, exact with FMA); e^r by its Taylor polynomial to degree 7, whose truncation error
// is below r^8/8! < 6e-9 relative; 2^n is applied as two factors 2^(n>>1) * 2^(n-(n>>1)) so
// every n in [-150, 128] is representable and results round once into the subnormals or
// overflow to +inf. Measured maximum relative error over all finite results: see
// kExpMaxRelError in ops.h (tested in ops_test.cpp). NaN in gives NaN out.
inline __m256 exp(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-104.0f);
  const __m256 hi = _mm256_set1_ps(89.0f);
  x = _mm256_max_ps(lo, _mm256_min_ps(hi, x));  // operand order keeps NaN
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606820309417232e-6f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i j = _mm256_srai_epi32(ni, 1);
  const __m256i k = _mm256_sub_epi32(ni, j);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(j, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

// cap * tanh(x / cap) on 8 lanes (cap > 0, inv_cap = 1 / cap): tanh(|y|) = 1 - 2 / (e^(2|y|) + 1)
// with the sign put back, so large |y| saturate to exactly +-cap (e^(2|y|) overflows to
// +inf) and the absolute error stays near cap times exp's relative error. NaN gives NaN.
inline __m256 softcap(__m256 x, __m256 cap, __m256 inv_cap) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 y = _mm256_mul_ps(x, inv_cap);
  const __m256 a = _mm256_andnot_ps(sign, y);
  const __m256 e = exp(_mm256_add_ps(a, a));
  const __m256 t = _mm256_sub_ps(_mm256_set1_ps(1.0f), _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
  return _mm256_mul_ps(_mm256_or_ps(t, _mm256_and_ps(sign, y)), cap);
}

// Horizontal sums and maxima: hsum_ps / hmax_ps (simd_avx2.h), one fixed order each.

// Lane mask with the first `count` lanes set (0 <= count <= 8), for maskload/maskstore.
inline __m256i first_lanes(int64_t count) {
  alignas(32) static constexpr int32_t kTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                     0,  0,  0,  0,  0,  0,  0,  0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTable + 8 - count));
}

}  // namespace metro::kernels::avx2
