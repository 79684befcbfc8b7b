// AVX2 quantization of F32 activations to the 8-bit partner formats. Bit-identical to the
// references (quant_ref.cpp, quant_ref_k.cpp): same scale arithmetic in float, ties
// rounded away from zero, sums of the integer quants.
#include "kernels/kernels_avx2.h"

#include <cmath>
#include <cstddef>
#include <cstring>

#include "kernels/quant_blocks.h"
#include "kernels/simd_avx2.h"

namespace metro::kernels::avx2 {

namespace {

__m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

// Quantizes 32 floats with inverse scale id to 32 int8 at q; returns sum(q).
int quantize32(const float* x, float id, int8_t* q) {
  const __m256 vid = _mm256_set1_ps(id);
  __m256i r[4];
  for (int j = 0; j < 4; ++j) r[j] = round_half_away_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), vid));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), pack_epi32_to_epi8(r[0], r[1], r[2], r[3]));
  return hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3])));
}

float amax32(const float* x) {
  __m256 m = abs_ps(_mm256_loadu_ps(x));
  for (int j = 1; j < 4; ++j) m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + 8 * j)));
  return hmax_ps(m);
}

}  // namespace

// Blocks are written in place (a stack copy would be re-read with mismatched sizes).
void quantize_row_q8_0(const float* x, void* dst, int64_t k, const ActSide& side) {
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < k / kQK; ++b) {
    const float* xb = x + b * kQK;
    uint8_t* blk = out + b * static_cast<int64_t>(sizeof(BlockQ8_0));
    const float d = amax32(xb) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int sum = quantize32(xb, id, reinterpret_cast<int8_t*>(blk + offsetof(BlockQ8_0, qs)));
    const uint16_t dh = to_f16(d);
    std::memcpy(blk + offsetof(BlockQ8_0, d), &dh, 2);
    if (side.d) side.d[b] = f16(dh);
    if (side.sums) side.sums[b] = sum;
  }
}

void quantize_row_q8_1(const float* x, void* dst, int64_t k, const ActSide& side) {
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < k / kQK; ++b) {
    const float* xb = x + b * kQK;
    uint8_t* blk = out + b * static_cast<int64_t>(sizeof(BlockQ8_1));
    const float d = amax32(xb) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int sum = quantize32(xb, id, reinterpret_cast<int8_t*>(blk + offsetof(BlockQ8_1, qs)));
    const uint16_t dh = to_f16(d), sh = to_f16(static_cast<float>(sum) * d);
    std::memcpy(blk + offsetof(BlockQ8_1, d), &dh, 2);
    std::memcpy(blk + offsetof(BlockQ8_1, s), &sh, 2);
    if (side.d) side.d[b] = f16(dh);
    if (side.s) side.s[b] = f16(sh);
  }
}

void quantize_row_q8_k(const float* x, void* dst, int64_t k, const ActSide&) {
  for (int64_t b = 0; b < k / kQKK; ++b) {
    const float* xb = x + b * kQKK;
    float amax = 0.0f;
    for (int j = 0; j < 8; ++j) amax = std::fmax(amax, amax32(xb + 32 * j));
    BlockQ8_K blk;
    blk.d = amax / 127.0f;
    const float id = blk.d != 0.0f ? 1.0f / blk.d : 0.0f;
    for (int j = 0; j < 8; ++j) quantize32(xb + 32 * j, id, blk.qs + 32 * j);
    // 16-element sums: widen to 16 bits and add pairs twice.
    for (int j = 0; j < 16; j += 2) {
      const __m256i q = _mm256_cvtepi8_epi16(load128(blk.qs + 16 * j));       // 16 values
      const __m256i q2 = _mm256_cvtepi8_epi16(load128(blk.qs + 16 * j + 16));  // the next 16
      const int s0 = hsum_epi32(_mm256_madd_epi16(q, _mm256_set1_epi16(1)));
      const int s1 = hsum_epi32(_mm256_madd_epi16(q2, _mm256_set1_epi16(1)));
      blk.bsums[j] = static_cast<int16_t>(s0);
      blk.bsums[j + 1] = static_cast<int16_t>(s1);
    }
    store_block(dst, b, blk);
  }
}

}  // namespace metro::kernels::avx2
