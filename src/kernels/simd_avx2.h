// AVX2 helpers shared by the *_avx2.cpp kernels (internal; include only from files built
// with AVX2 + FMA + F16C, which run only after cpu_features() says the CPU has them).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace metro::kernels::avx2 {

inline __m256i bcast_i32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

inline float f16(uint16_t h) { return _cvtsh_ss(h); }
// Through the vector form: clang's _cvtss_sh macro uses a C99 compound literal, which
// -Wpedantic -Werror refuses in C++.
inline uint16_t to_f16(float f) {
  return static_cast<uint16_t>(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}

// 8 binary16 values (16 bytes, any alignment) as floats.
inline __m256 load_f16x8(const void* p) { return _mm256_cvtph_ps(load128(p)); }

// Lane r of the result is the sum of the 8 lanes of v[r].
inline __m256i reduce8_epi32(const __m256i v[8]) {
  const __m256i t0 = _mm256_hadd_epi32(v[0], v[1]);
  const __m256i t1 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i t2 = _mm256_hadd_epi32(v[4], v[5]);
  const __m256i t3 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i u0 = _mm256_hadd_epi32(t0, t1);
  const __m256i u1 = _mm256_hadd_epi32(t2, t3);
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// A fixed-order float reduction: ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)).
inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax_ps(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Stores the first n (<= 8) lanes.
inline void store_lanes(float* y, __m256 v, int n) {
  if (n == 8) {
    _mm256_storeu_ps(y, v);
    return;
  }
  alignas(32) float tmp[8];
  _mm256_store_ps(tmp, v);
  for (int i = 0; i < n; ++i) y[i] = tmp[i];
}

// 32 bytes of 4-bit values from 16 packed bytes: element i < 16 from the low nibble of
// byte i, element i + 16 from its high nibble (the GGUF order).
inline __m256i unpack_nibbles32(const uint8_t* qs) {
  const __m128i b = load128(qs);
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// Bit i of the 32-bit word as 0x10 in byte i, 0 otherwise (the fifth bit of Q5 values).
inline __m256i expand_bits_to_0x10(uint32_t bits) {
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                                        3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(bits)), shuf);
  v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

// Round half away from zero (C's roundf) of floats holding |v| < 2^23, as int32.
inline __m256i round_half_away_epi32(__m256 v) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 a = _mm256_andnot_ps(sign, v);
  const __m256 t = _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 up = _mm256_and_ps(_mm256_cmp_ps(_mm256_sub_ps(a, t), _mm256_set1_ps(0.5f), _CMP_GE_OQ),
                                  _mm256_set1_ps(1.0f));
  const __m256 r = _mm256_or_ps(_mm256_add_ps(t, up), _mm256_and_ps(v, sign));
  return _mm256_cvtps_epi32(r);  // r is an integer: exact
}

// 32 int32 (4 registers, elements in order) to 32 int8 (values in -127..127).
inline __m256i pack_epi32_to_epi8(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_packs_epi32(a, b);  // a0-3 b0-3 | a4-7 b4-7 (16-bit)
  const __m256i cd = _mm256_packs_epi32(c, d);
  const __m256i abcd = _mm256_packs_epi16(ab, cd);  // a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7
  return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

}  // namespace metro::kernels::avx2
