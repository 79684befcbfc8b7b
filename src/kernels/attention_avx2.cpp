// AVX2 tile kernel of paged attention. Per chunk of up to kKeyChunk keys: the chunk's K
// rows are converted to F32 once (F16C, or Q8_0 dequantized per row) and scored against
// every row of the tile with FMA, each row's online-softmax state is updated, then the V
// rows are converted and accumulated into every row with FMA. Converted rows live in
// stack buffers that stay in L1/L2 while all rows of the tile use them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/fp16.h"
#include "kernels/attention_impl.h"
#include "kernels/ops_avx2.h"

namespace metro::kernels::detail {

namespace {

void store_f16(const float* x, uint8_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
  }
  for (; i < n; ++i) {
    const uint16_t h = fp32_to_fp16(x[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

void convert_row(DType type, const uint8_t* src, float* dst, int hd) {
  if (type == DType::kF16) {
    for (int d = 0; d < hd; d += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * d));
      _mm256_store_ps(dst + d, _mm256_cvtph_ps(h));
    }
    return;
  }
  for (int b = 0; b < hd / 32; ++b) {  // Q8_0: { f16 d; int8 q[32]; }
    const uint8_t* blk = src + b * 34;
    uint16_t dh;
    std::memcpy(&dh, blk, 2);
    const __m256 scale = _mm256_set1_ps(_cvtsh_ss(dh));
    for (int k = 0; k < 4; ++k) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * k));
      const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
      _mm256_store_ps(dst + b * 32 + 8 * k, _mm256_mul_ps(v, scale));
    }
  }
}

// Scores of one query row against keys k0..k0+3 (rows of kf, head_dim floats apart).
// Always 4 keys, so every score comes out of the same reduction order.
__m128 dot4(const float* q, const float* k0, int hd) {
  __m256 a0 = _mm256_setzero_ps();
  __m256 a1 = _mm256_setzero_ps();
  __m256 a2 = _mm256_setzero_ps();
  __m256 a3 = _mm256_setzero_ps();
  for (int d = 0; d < hd; d += 8) {
    const __m256 qv = _mm256_load_ps(q + d);
    a0 = _mm256_fmadd_ps(qv, _mm256_load_ps(k0 + d), a0);
    a1 = _mm256_fmadd_ps(qv, _mm256_load_ps(k0 + hd + d), a1);
    a2 = _mm256_fmadd_ps(qv, _mm256_load_ps(k0 + 2 * hd + d), a2);
    a3 = _mm256_fmadd_ps(qv, _mm256_load_ps(k0 + 3 * hd + d), a3);
  }
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

// acc[0..hd) = acc * alpha + sum_j p[j] * v[j], j < n; blocks of 4 vectors, then single
// vectors, with the same per-lane operation order either way.
void accumulate(float* acc, float alpha, const float* p, const float* v, int n, int hd) {
  const __m256 va = _mm256_set1_ps(alpha);
  int d = 0;
  for (; d + 32 <= hd; d += 32) {
    __m256 a0 = _mm256_mul_ps(_mm256_load_ps(acc + d), va);
    __m256 a1 = _mm256_mul_ps(_mm256_load_ps(acc + d + 8), va);
    __m256 a2 = _mm256_mul_ps(_mm256_load_ps(acc + d + 16), va);
    __m256 a3 = _mm256_mul_ps(_mm256_load_ps(acc + d + 24), va);
    for (int j = 0; j < n; ++j) {
      const __m256 pj = _mm256_broadcast_ss(p + j);
      const float* vj = v + j * hd + d;
      a0 = _mm256_fmadd_ps(pj, _mm256_load_ps(vj), a0);
      a1 = _mm256_fmadd_ps(pj, _mm256_load_ps(vj + 8), a1);
      a2 = _mm256_fmadd_ps(pj, _mm256_load_ps(vj + 16), a2);
      a3 = _mm256_fmadd_ps(pj, _mm256_load_ps(vj + 24), a3);
    }
    _mm256_store_ps(acc + d, a0);
    _mm256_store_ps(acc + d + 8, a1);
    _mm256_store_ps(acc + d + 16, a2);
    _mm256_store_ps(acc + d + 24, a3);
  }
  for (; d < hd; d += 8) {
    __m256 a0 = _mm256_mul_ps(_mm256_load_ps(acc + d), va);
    for (int j = 0; j < n; ++j) {
      a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), _mm256_load_ps(v + j * hd + d), a0);
    }
    _mm256_store_ps(acc + d, a0);
  }
}

void tile_avx2(const AttentionParams& p, const AttentionSeq& seq, const AttentionTile& t) {
  const KvPageLayout& lay = p.layout;
  const int hd = lay.head_dim;
  const int group = p.n_head / lay.n_head_kv;
  const int rows = t.row_end - t.row_begin;
  alignas(32) float q[kMaxTileFloats];
  alignas(32) float acc[kMaxTileFloats];
  alignas(32) float kf[kKeyChunk * kMaxHeadDim];
  alignas(32) float vf[kKeyChunk * kMaxHeadDim];
  alignas(32) float prob[kMaxTileRows * kKeyChunk];
  float m[kMaxTileRows];
  float l[kMaxTileRows];
  float alpha[kMaxTileRows];
  int valid[kMaxTileRows];
  int64_t qpos[kMaxTileRows];

  const __m256 vscale = _mm256_set1_ps(p.scale);
  for (int r = 0; r < rows; ++r) {
    const int row = t.row_begin + r;
    const int qi = row / group;
    const int h = t.kv_head * group + row % group;
    const float* src = seq.q + static_cast<size_t>(qi) * seq.q_stride + static_cast<size_t>(h) * hd;
    for (int d = 0; d < hd; d += 8) {
      _mm256_store_ps(q + r * hd + d, _mm256_mul_ps(_mm256_loadu_ps(src + d), vscale));
      _mm256_store_ps(acc + r * hd + d, _mm256_setzero_ps());
    }
    // Score lanes past a row's last valid key are computed (and masked) too: keep them finite.
    std::fill(prob + r * kKeyChunk, prob + (r + 1) * kKeyChunk, 0.0f);
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0f;
    qpos[r] = seq.pos0 + qi;
  }

  const int64_t last = qpos[rows - 1];
  for (int64_t kb = 0; kb <= last; kb += kKeyChunk) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeyChunk, last + 1 - kb));
    for (int j = 0; j < nk; ++j) {
      convert_row(lay.type, kv_row(lay, seq.k_pages, t.kv_head, kb + j), kf + j * hd, hd);
    }
    const int nk4 = (nk + 3) & ~3;
    std::fill(kf + nk * hd, kf + nk4 * hd, 0.0f);

    // Rows are sorted by causal limit, so the ones that see no key of this chunk come first.
    int first = 0;
    while (first < rows && qpos[first] < kb) valid[first++] = 0;
    for (int r = first; r < rows; ++r) {
      const int n = static_cast<int>(std::min<int64_t>(nk, qpos[r] + 1 - kb));
      valid[r] = n;
      float* s = prob + r * kKeyChunk;
      for (int j = 0; j < n; j += 4) _mm_store_ps(s + j, dot4(q + r * hd, kf + j * hd, hd));
      float mx = m[r];
      for (int j = 0; j < n; ++j) mx = std::max(mx, s[j]);
      const __m256 vmx = _mm256_set1_ps(mx);
      __m256 sum = _mm256_setzero_ps();
      for (int j = 0; j < n; j += 8) {
        const __m256 mask = _mm256_castsi256_ps(avx2::first_lanes(std::min(8, n - j)));
        const __m256 e = _mm256_and_ps(avx2::exp(_mm256_sub_ps(_mm256_load_ps(s + j), vmx)), mask);
        _mm256_store_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
      }
      alpha[r] = std::exp(m[r] - mx);  // 0 on the first chunk (m = -inf)
      l[r] = l[r] * alpha[r] + avx2::hsum(sum);
      m[r] = mx;
    }

    for (int j = 0; j < nk; ++j) {
      convert_row(lay.type, kv_row(lay, seq.v_pages, t.kv_head, kb + j), vf + j * hd, hd);
    }
    for (int r = first; r < rows; ++r) {
      accumulate(acc + r * hd, alpha[r], prob + r * kKeyChunk, vf, valid[r], hd);
    }
  }

  for (int r = 0; r < rows; ++r) {
    const int row = t.row_begin + r;
    const int qi = row / group;
    const int h = t.kv_head * group + row % group;
    float* dst = seq.out + static_cast<size_t>(qi) * seq.out_stride + static_cast<size_t>(h) * hd;
    const __m256 inv = _mm256_set1_ps(1.0f / l[r]);
    for (int d = 0; d < hd; d += 8) {
      _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_load_ps(acc + r * hd + d), inv));
    }
  }
}

}  // namespace

const AttentionKernels kAttentionAvx2 = {"avx2", tile_avx2, store_f16};

}  // namespace metro::kernels::detail
