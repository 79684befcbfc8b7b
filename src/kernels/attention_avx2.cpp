// AVX2 tile kernel of paged attention. Per chunk of up to kKeyChunk keys: the chunk's K
// rows are converted to F32 once (F16C; Q8_0 rows to their int8 values as floats, scored
// against the query's int8 values, see score_q8x4) and scored against every row of the tile
// with FMA, each row's online-softmax state is updated, then the V rows are converted and
// accumulated into every row with FMA. Converted rows live in stack buffers that stay in
// L1/L2 while all rows of the tile use them. Decodes (one query) have a kernel of their own
// that converts in registers (decode_tile).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "base/fp16.h"
#include "kernels/attention_impl.h"
#include "kernels/kernel_table.h"
#include "kernels/kernels_avx2.h"
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

template <DType kType>
inline void convert_row(const uint8_t* src, float* dst, int hd) {
  if constexpr (kType == DType::kF16) {
    for (int d = 0; d < hd; d += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * d));
      _mm256_store_ps(dst + d, _mm256_cvtph_ps(h));
    }
  } else {
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
}

// Pages are scattered through the KV arena, so the hardware prefetcher loses the stream at
// every page boundary. Decode only streams K and V, so while one chunk's rows are converted
// the next chunk's rows are requested, one row per converted row to keep few misses in
// flight at a time.
void prefetch_row(const uint8_t* row, size_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(row) & ~uintptr_t{63};
  const uintptr_t end = reinterpret_cast<uintptr_t>(row) + bytes;
  for (uintptr_t line = begin; line < end; line += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
  }
}

void prefetch_rows(const PagedRows& rows, int64_t from, int64_t to) {
  if (to <= from) return;
  rows.for_each_run(from, static_cast<int>(to - from), [&](int, const uint8_t* run, int count) {
    prefetch_row(run, static_cast<size_t>(count) * rows.row_bytes());
  });
}

// Converts rows [from, from + n) to F32 rows of dst, prefetching rows [from + n, ahead_to).
template <DType kType>
void convert_rows(const PagedRows& rows, int64_t from, int n, int64_t ahead_to, float* dst, int hd) {
  const int64_t ahead_n = std::min<int64_t>(n, ahead_to - (from + n));
  const size_t rb = rows.row_bytes();
  rows.for_each_run(from, n, [&](int j0, const uint8_t* run, int count) {
    for (int j = 0; j < count; ++j) {
      if (j0 + j < ahead_n) prefetch_row(rows.row(from + n + j0 + j), rb);
      convert_row<kType>(run + static_cast<size_t>(j) * rb, dst + (j0 + j) * hd, hd);
    }
  });
}

// The four scores of keys k..k+3 from four 8-lane partial sums: one reduction tree used
// for every score, so a score's bits never depend on which path computed it.
inline __m128 reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

// Scores of one query row against keys k0..k0+3 (rows of kf, head_dim floats apart).
__m128 dot1x4(const float* q, const float* k0, int hd) {
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
  return reduce4(a0, a1, a2, a3);
}

// Two query rows against keys k0..k0+3 (rows of kf, hd floats apart) over dimensions
// [d0, d1): each key vector loaded once feeds both rows; a[c] / b[c] gather key c's lanes.
inline void fma2x4(const float* q0, const float* q1, const float* k0, int hd, int d0, int d1, __m256* a,
                   __m256* b) {
  for (int c = 0; c < 4; ++c) a[c] = b[c] = _mm256_setzero_ps();
  for (int d = d0; d < d1; d += 8) {
    const __m256 qa = _mm256_load_ps(q0 + d);
    const __m256 qb = _mm256_load_ps(q1 + d);
    for (int c = 0; c < 4; ++c) {
      const __m256 k = _mm256_load_ps(k0 + c * hd + d);
      a[c] = _mm256_fmadd_ps(qa, k, a[c]);
      b[c] = _mm256_fmadd_ps(qb, k, b[c]);
    }
  }
}

// The same as dot1x4 for two query rows at once.
void dot2x4(const float* q0, const float* q1, const float* k0, int hd, float* s0, float* s1) {
  __m256 a[4], b[4];
  fma2x4(q0, q1, k0, hd, 0, hd, a, b);
  _mm_store_ps(s0, reduce4(a[0], a[1], a[2], a[3]));
  _mm_store_ps(s1, reduce4(b[0], b[1], b[2], b[3]));
}

// Q8_0 keys (attention_impl.h): a score is, over the blocks b of 32 in order,
// acc = fma(S_b, dq_b x dk_b, acc) from acc = 0, where S_b is the exact integer dot product of
// the int8 query and key values of the block and dq_b x dk_b the float product of their
// scales. Every path computes S_b exactly (by integer lanes in score_q8x4, by float sums of
// integers below 2^24 in dot2x4_q8), so a score has the same bits on every path.
alignas(32) const uint16_t kZeroRow[kMaxHeadDim] = {};  // F16 zeros; Q8_0: scale 0, q 0

// Scores of R int8 query rows (values hd apart, scales hd/32 apart) against the four key
// rows k[0..3], read straight from the pages: for decodes, where no converted key would be
// reused. Per block: |q| x (k with q's sign) by maddubs (pairs of products stay below 2^15
// since |q| <= 127), summed to 8 int32 lanes by madd, the four keys' lanes to one sum each
// by hadd (integer sums are exact, so the same S_b as dot2x4_q8's float lanes).
template <int R>
inline void score_q8x4(const int8_t* qi, const float* qd, const uint8_t* const* k, int hd,
                       float* s, int s_stride) {
  const __m256i ones = _mm256_set1_epi16(1);
  const int nb = hd / 32;
  __m128 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    __m256i kv[4];
    alignas(16) float kd[4];
    for (int c = 0; c < 4; ++c) {
      const uint8_t* blk = k[c] + b * 34;
      uint16_t h;
      std::memcpy(&h, blk, 2);
      kd[c] = _cvtsh_ss(h);
      kv[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    }
    const __m128 kd4 = _mm_load_ps(kd);
    for (int r = 0; r < R; ++r) {
      const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qi + r * hd + b * 32));
      const __m256i ax = _mm256_sign_epi8(qv, qv);
      __m256i m[4];
      for (int c = 0; c < 4; ++c) {
        m[c] = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(kv[c], qv)), ones);
      }
      const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(m[0], m[1]), _mm256_hadd_epi32(m[2], m[3]));
      const __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
      const __m128 scale = _mm_mul_ps(_mm_set1_ps(qd[r * nb + b]), kd4);
      acc[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(sum), scale, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm_storeu_ps(s + r * s_stride, acc[r]);
}

// Q8_0 key rows for a tile of many rows: each key's int8 values as floats (unscaled, so a
// product sum of a block is an exact integer in float: at most 32 x 127 x 127 < 2^24) and its
// scale per block ([block][key], kKeyChunk keys). Converted once per chunk, shared by the rows.
void convert_rows_q8(const uint8_t* const* k, int n, int hd, float* kf, float* kd) {
  const int nb = hd / 32;
  for (int j = 0; j < n; ++j) {
    for (int b = 0; b < nb; ++b) {
      const uint8_t* blk = k[j] + b * 34;
      uint16_t h;
      std::memcpy(&h, blk, 2);
      kd[b * kKeyChunk + j] = _cvtsh_ss(h);
      for (int i = 0; i < 4; ++i) {
        const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * i));
        _mm256_store_ps(kf + j * hd + b * 32 + 8 * i, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)));
      }
    }
  }
}

// Scores of two query rows (int8 values as floats, and their scales) against converted keys
// j..j+3 (kf rows from key j, kd from key j): per block, the exact integer sums S_b by FMA
// lanes and the reduce4 tree, then fma(S_b, dq_b x dk_b, acc) as score_q8x4 does.
void dot2x4_q8(const float* q0, const float* q1, const float* qd0, const float* qd1,
               const float* kf, const float* kd, int hd, float* s0, float* s1) {
  __m128 acc0 = _mm_setzero_ps();
  __m128 acc1 = _mm_setzero_ps();
  for (int b = 0; b < hd / 32; ++b) {
    __m256 x[4], y[4];
    fma2x4(q0, q1, kf, hd, b * 32, b * 32 + 32, x, y);
    const __m128 kd4 = _mm_loadu_ps(kd + b * kKeyChunk);
    acc0 = _mm_fmadd_ps(reduce4(x[0], x[1], x[2], x[3]), _mm_mul_ps(_mm_set1_ps(qd0[b]), kd4), acc0);
    acc1 = _mm_fmadd_ps(reduce4(y[0], y[1], y[2], y[3]), _mm_mul_ps(_mm_set1_ps(qd1[b]), kd4), acc1);
  }
  _mm_storeu_ps(s0, acc0);
  _mm_storeu_ps(s1, acc1);
}

// acc[0..hd) = acc * alpha + sum_j p[j] * v[j], j < n (V rows `stride` floats apart); blocks
// of 4 vectors, then single vectors, with the same per-lane operation order either way.
void accumulate(float* acc, float alpha, const float* p, const float* v, int n, int hd, int stride) {
  const __m256 va = _mm256_set1_ps(alpha);
  int d = 0;
  for (; d + 32 <= hd; d += 32) {
    __m256 a0 = _mm256_mul_ps(_mm256_load_ps(acc + d), va);
    __m256 a1 = _mm256_mul_ps(_mm256_load_ps(acc + d + 8), va);
    __m256 a2 = _mm256_mul_ps(_mm256_load_ps(acc + d + 16), va);
    __m256 a3 = _mm256_mul_ps(_mm256_load_ps(acc + d + 24), va);
    for (int j = 0; j < n; ++j) {
      const __m256 pj = _mm256_broadcast_ss(p + j);
      const float* vj = v + j * stride + d;
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
      a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), _mm256_load_ps(v + j * stride + d), a0);
    }
    _mm256_store_ps(acc + d, a0);
  }
}

// Two rows of accumulate() sharing each V load, for the keys both rows see (j < n);
// bit-identical to two accumulate() calls over those keys.
void accumulate2(float* acc0, float* acc1, float alpha0, float alpha1, const float* p0,
                 const float* p1, const float* v, int n, int hd, int stride) {
  const __m256 va0 = _mm256_set1_ps(alpha0);
  const __m256 va1 = _mm256_set1_ps(alpha1);
  int d = 0;
  for (; d + 32 <= hd; d += 32) {
    __m256 a0 = _mm256_mul_ps(_mm256_load_ps(acc0 + d), va0);
    __m256 a1 = _mm256_mul_ps(_mm256_load_ps(acc0 + d + 8), va0);
    __m256 a2 = _mm256_mul_ps(_mm256_load_ps(acc0 + d + 16), va0);
    __m256 a3 = _mm256_mul_ps(_mm256_load_ps(acc0 + d + 24), va0);
    __m256 b0 = _mm256_mul_ps(_mm256_load_ps(acc1 + d), va1);
    __m256 b1 = _mm256_mul_ps(_mm256_load_ps(acc1 + d + 8), va1);
    __m256 b2 = _mm256_mul_ps(_mm256_load_ps(acc1 + d + 16), va1);
    __m256 b3 = _mm256_mul_ps(_mm256_load_ps(acc1 + d + 24), va1);
    for (int j = 0; j < n; ++j) {
      const __m256 pa = _mm256_broadcast_ss(p0 + j);
      const __m256 pb = _mm256_broadcast_ss(p1 + j);
      const float* vj = v + j * stride + d;
      __m256 x = _mm256_load_ps(vj);
      a0 = _mm256_fmadd_ps(pa, x, a0);
      b0 = _mm256_fmadd_ps(pb, x, b0);
      x = _mm256_load_ps(vj + 8);
      a1 = _mm256_fmadd_ps(pa, x, a1);
      b1 = _mm256_fmadd_ps(pb, x, b1);
      x = _mm256_load_ps(vj + 16);
      a2 = _mm256_fmadd_ps(pa, x, a2);
      b2 = _mm256_fmadd_ps(pb, x, b2);
      x = _mm256_load_ps(vj + 24);
      a3 = _mm256_fmadd_ps(pa, x, a3);
      b3 = _mm256_fmadd_ps(pb, x, b3);
    }
    _mm256_store_ps(acc0 + d, a0);
    _mm256_store_ps(acc0 + d + 8, a1);
    _mm256_store_ps(acc0 + d + 16, a2);
    _mm256_store_ps(acc0 + d + 24, a3);
    _mm256_store_ps(acc1 + d, b0);
    _mm256_store_ps(acc1 + d + 8, b1);
    _mm256_store_ps(acc1 + d + 16, b2);
    _mm256_store_ps(acc1 + d + 24, b3);
  }
  for (; d < hd; d += 8) {
    __m256 a0 = _mm256_mul_ps(_mm256_load_ps(acc0 + d), va0);
    __m256 b0 = _mm256_mul_ps(_mm256_load_ps(acc1 + d), va1);
    for (int j = 0; j < n; ++j) {
      const __m256 x = _mm256_load_ps(v + j * stride + d);
      a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p0 + j), x, a0);
      b0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p1 + j), x, b0);
    }
    _mm256_store_ps(acc0 + d, a0);
    _mm256_store_ps(acc1 + d, b0);
  }
}

// Continues accumulate() of one row over keys [from, n) after a call that covered [0, from).
void accumulate_more(float* acc, const float* p, const float* v, int from, int n, int hd, int stride) {
  for (int d = 0; d < hd; d += 8) {
    __m256 a0 = _mm256_load_ps(acc + d);
    for (int j = from; j < n; ++j) {
      a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), _mm256_load_ps(v + j * stride + d), a0);
    }
    _mm256_store_ps(acc + d, a0);
  }
}

// Lanes j..j+7 of a chunk that lie in [lo, n).
inline __m256 chunk_lanes(int j, int lo, int n) {
  __m256i mask = avx2::first_lanes(std::min(8, n - j));
  if (lo > j) mask = _mm256_andnot_si256(avx2::first_lanes(std::min(8, lo - j)), mask);
  return _mm256_castsi256_ps(mask);
}

// One row's online-softmax step over the scores [lo, n) of a chunk (lo > 0 only in the
// chunk that holds the first key of the row's window): the running max m and sum l move
// on, the scores become exp(s - new max) (lanes outside: exactly 0, read but masked), and
// the factor the row's accumulator must be rescaled by is returned (0 on the first chunk).
// With soft-capping (cap > 0) the scores are capped first.
inline float softmax_chunk(float* s, int lo, int n, float* m, float* l, float cap) {
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  if (cap > 0.0f) {
    const __m256 c = _mm256_set1_ps(cap), ic = _mm256_set1_ps(1.0f / cap);
    for (int j = 0; j < n; j += 8) _mm256_store_ps(s + j, avx2::softcap(_mm256_load_ps(s + j), c, ic));
  }
  __m256 vmx = _mm256_set1_ps(*m);
  for (int j = 0; j < n; j += 8) {
    const __m256 mask = chunk_lanes(j, lo, n);
    vmx = _mm256_max_ps(vmx, _mm256_blendv_ps(neg_inf, _mm256_load_ps(s + j), mask));
  }
  const float mx = avx2::hmax_ps(vmx);
  vmx = _mm256_set1_ps(mx);
  __m256 sum = _mm256_setzero_ps();
  for (int j = 0; j < n; j += 8) {
    const __m256 mask = chunk_lanes(j, lo, n);
    const __m256 e = _mm256_and_ps(avx2::exp(_mm256_sub_ps(_mm256_load_ps(s + j), vmx)), mask);
    _mm256_store_ps(s + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  const float alpha = std::exp(*m - mx);  // 0 on the first chunk (m = -inf)
  *l = *l * alpha + avx2::hsum_ps(sum);
  *m = mx;
  return alpha;
}

// Row r of a tile: its query's scaled q into q_row, zeros into acc_row. Rows are query-major
// (see attention_impl.h): query r / group, head kv_head * group + r % group.
inline void start_row(const AttentionParams& p, const AttentionSeq& seq, const AttentionTile& t, int group,
                      int r, float* q_row, float* acc_row) {
  const int hd = p.layout.head_dim;
  const int row = t.row_begin + r;
  const float* src = seq.q + static_cast<size_t>(row / group) * seq.q_stride +
                     static_cast<size_t>(t.kv_head * group + row % group) * hd;
  const __m256 vscale = _mm256_set1_ps(p.scale);
  for (int d = 0; d < hd; d += 8) {
    _mm256_store_ps(q_row + d, _mm256_mul_ps(_mm256_loadu_ps(src + d), vscale));
    _mm256_store_ps(acc_row + d, _mm256_setzero_ps());
  }
}

// Row r's output: its accumulator over the softmax sum l.
inline void finish_row(const AttentionSeq& seq, const AttentionTile& t, int group, int hd, int r,
                       const float* acc_row, float l) {
  const int row = t.row_begin + r;
  float* dst = seq.out + static_cast<size_t>(row / group) * seq.out_stride +
               static_cast<size_t>(t.kv_head * group + row % group) * hd;
  const __m256 inv = _mm256_set1_ps(1.0f / l);
  for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_load_ps(acc_row + d), inv));
}

template <DType kType>
void tile_impl(const AttentionParams& p, const AttentionSeq& seq, const AttentionTile& t) {
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
  int lo[kMaxTileRows];  // a row's first key in the chunk (its window's start, or 0)
  int64_t qpos[kMaxTileRows];
  int64_t ws[kMaxTileRows];  // a row's first key position
  constexpr bool kQ8 = kType == DType::kQ8_0;
  const int nb = hd / 32;
  float qd[kQ8 ? kMaxTileFloats / 32 : 1];  // Q8_0: each row's query scales; q holds its int8 values
  alignas(32) float kd[kQ8 ? kMaxHeadDim / 32 * kKeyChunk : 1];
  const uint8_t* kp[kKeyChunk + 3];  // Q8_0: the chunk's key rows, padded with zero rows

  for (int r = 0; r < rows; ++r) {
    start_row(p, seq, t, group, r, q + r * hd, acc + r * hd);
    if constexpr (kQ8) {
      int8_t qi[kMaxHeadDim];
      quantize_query_q8(q + r * hd, hd, qi, qd + r * nb);
      for (int d = 0; d < hd; ++d) q[r * hd + d] = static_cast<float>(qi[d]);
    }
    // Score lanes past a row's last valid key are computed (and masked) too: keep them finite.
    std::fill(prob + r * kKeyChunk, prob + (r + 1) * kKeyChunk, 0.0f);
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0f;
    qpos[r] = seq.pos0 + (t.row_begin + r) / group;
    ws[r] = window_start(p, qpos[r]);
  }

  const PagedRows keys(lay, seq.k_pages, t.kv_head);
  const PagedRows values(lay, seq.v_pages, t.kv_head);
  const int64_t last = qpos[rows - 1];
  const int64_t kb0 = ws[0] / kKeyChunk * kKeyChunk;
  prefetch_rows(keys, kb0, std::min<int64_t>(kb0 + kKeyChunk, last + 1));
  prefetch_rows(values, kb0, std::min<int64_t>(kb0 + kKeyChunk, last + 1));
  for (int64_t kb = kb0; kb <= last; kb += kKeyChunk) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeyChunk, last + 1 - kb));
    const int64_t next_end = std::min<int64_t>(kb + 2 * kKeyChunk, last + 1);
    const int nk4 = (nk + 3) & ~3;
    if constexpr (kQ8) {
      keys.for_each_run(kb, nk, [&](int j0, const uint8_t* run, int count) {
        for (int j = 0; j < count; ++j) kp[j0 + j] = run + static_cast<size_t>(j) * keys.row_bytes();
      });
      std::fill(kp + nk, kp + nk4, reinterpret_cast<const uint8_t*>(kZeroRow));
      prefetch_rows(keys, kb + nk, next_end);
      convert_rows_q8(kp, nk4, hd, kf, kd);
    } else {
      convert_rows<kType>(keys, kb, nk, next_end, kf, hd);
      std::fill(kf + nk * hd, kf + nk4 * hd, 0.0f);
    }

    // Rows are sorted by causal limit and window start, so the ones whose keys all come
    // after this chunk come first, and the ones whose window starts after it come last.
    int first = 0;
    while (first < rows && qpos[first] < kb) valid[first++] = 0;
    int end = rows;
    while (end > first && ws[end - 1] >= kb + nk) valid[--end] = 0;
    for (int r = first; r < end; ++r) {
      valid[r] = static_cast<int>(std::min<int64_t>(nk, qpos[r] + 1 - kb));
      lo[r] = static_cast<int>(std::max<int64_t>(0, ws[r] - kb));
    }
    // Scores, two rows at a time; the pair's second row sees at least the first's keys.
    int r = first;
    for (; r + 1 < end; r += 2) {
      float* s0 = prob + r * kKeyChunk;
      for (int j = 0; j < valid[r + 1]; j += 4) {
        if constexpr (kQ8) {
          dot2x4_q8(q + r * hd, q + (r + 1) * hd, qd + r * nb, qd + (r + 1) * nb, kf + j * hd, kd + j, hd,
                    s0 + j, s0 + kKeyChunk + j);
        } else {
          dot2x4(q + r * hd, q + (r + 1) * hd, kf + j * hd, hd, s0 + j, s0 + kKeyChunk + j);
        }
      }
    }
    if (r < end) {
      float* s = prob + r * kKeyChunk;
      alignas(16) float unused[4];
      for (int j = 0; j < valid[r]; j += 4) {
        if constexpr (kQ8) {  // the pair kernel with the row twice: one code path for the bits
          dot2x4_q8(q + r * hd, q + r * hd, qd + r * nb, qd + r * nb, kf + j * hd, kd + j, hd, s + j, unused);
        } else {
          _mm_store_ps(s + j, dot1x4(q + r * hd, kf + j * hd, hd));
        }
      }
    }
    for (r = first; r < end; ++r) {
      float* s = prob + r * kKeyChunk;
      alpha[r] = softmax_chunk(s, lo[r], valid[r], &m[r], &l[r], p.softcap);
    }

    if constexpr (kQ8) {
      // Q8_0 values: each row's weights times the value's block scale, against the int8
      // values as floats, block by block (decode_tile computes the same products).
      values.for_each_run(kb, nk, [&](int j0, const uint8_t* run, int count) {
        for (int j = 0; j < count; ++j) kp[j0 + j] = run + static_cast<size_t>(j) * values.row_bytes();
      });
      prefetch_rows(values, kb + nk, next_end);
      convert_rows_q8(kp, nk, hd, vf, kd);
      alignas(32) float pw0[kKeyChunk];
      alignas(32) float pw1[kKeyChunk];
      for (r = first; r < end; r += 2) {
        const bool pair = r + 1 < end;
        const float* p0 = prob + r * kKeyChunk;
        for (int b = 0; b < nb; ++b) {
          const float* vd = kd + b * kKeyChunk;
          for (int j = 0; j < valid[pair ? r + 1 : r]; ++j) {
            pw0[j] = p0[j] * vd[j];
            if (pair) pw1[j] = p0[kKeyChunk + j] * vd[j];
          }
          float* a0 = acc + r * hd + b * 32;
          if (!pair) {
            accumulate(a0, alpha[r], pw0, vf + b * 32, valid[r], 32, hd);
            continue;
          }
          accumulate2(a0, a0 + hd, alpha[r], alpha[r + 1], pw0, pw1, vf + b * 32, valid[r], 32, hd);
          if (valid[r + 1] > valid[r]) accumulate_more(a0 + hd, pw1, vf + b * 32, valid[r], valid[r + 1], 32, hd);
        }
      }
    } else {
      convert_rows<kType>(values, kb, nk, next_end, vf, hd);
      for (r = first; r + 1 < end; r += 2) {
        float* acc0 = acc + r * hd;
        float* acc1 = acc0 + hd;
        const float* p0 = prob + r * kKeyChunk;
        accumulate2(acc0, acc1, alpha[r], alpha[r + 1], p0, p0 + kKeyChunk, vf, valid[r], hd, hd);
        if (valid[r + 1] > valid[r]) accumulate_more(acc1, p0 + kKeyChunk, vf, valid[r], valid[r + 1], hd, hd);
      }
      if (r < end) accumulate(acc + r * hd, alpha[r], prob + r * kKeyChunk, vf, valid[r], hd, hd);
    }
  }

  for (int r = 0; r < rows; ++r) finish_row(seq, t, group, hd, r, acc + r * hd, l[r]);
}

// Eight values of a K or V row from dimension d, as convert_row<kType> makes them. Q8_0
// rows scale each block of 32 by its own factor: span_scale reads it once per block (F16
// has none), load8 applies it.
template <DType kType>
inline constexpr int kSpan = kType == DType::kF16 ? 8 : 32;

template <DType kType>
inline __m256 span_scale(const uint8_t* row, int d) {
  if constexpr (kType == DType::kF16) {
    (void)row;
    (void)d;
    return _mm256_setzero_ps();
  } else {  // Q8_0: { f16 d; int8 q[32]; } per 32 values
    uint16_t dh;
    std::memcpy(&dh, row + (d / 32) * 34, 2);
    return _mm256_set1_ps(_cvtsh_ss(dh));
  }
}

template <DType kType>
inline __m256 load8(const uint8_t* row, int d, __m256 scale) {
  if constexpr (kType == DType::kF16) {
    (void)scale;
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * d)));
  } else {
    const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + (d / 32) * 34 + 2 + d % 32));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), scale);
  }
}

// A decode tile: every row is a head of one query, so all rows see the same
// keys. K and V rows are converted in registers straight from the pages and each converted
// vector feeds every row, instead of going through the stack buffers tile_impl shares
// among up to 128 rows (with R <= 3 rows that round trip was most of the instructions).
// Per row, the float operations and their order are tile_impl's: scores by the same FMA
// chains and reduce4 tree (keys past the chunk's end score against a zero row, as
// tile_impl's zero padding), the same softmax update, and acc * alpha + sum of p_j v_j
// in key order. So a decode gives the same bits on either path.
template <DType kType, int R>
void decode_tile(const AttentionParams& p, const AttentionSeq& seq, const AttentionTile& t) {
  const KvPageLayout& lay = p.layout;
  const int hd = lay.head_dim;
  const int group = p.n_head / lay.n_head_kv;
  alignas(32) float q[R * kMaxHeadDim];
  alignas(32) float acc[R * kMaxHeadDim];
  alignas(32) float prob[R * kKeyChunk];
  constexpr bool kQ8 = kType == DType::kQ8_0;
  const int nb = hd / 32;
  alignas(32) int8_t q8[kQ8 ? R * kMaxHeadDim : 1];
  float q8d[kQ8 ? R * kMaxHeadDim / 32 : 1];
  float m[R];
  float l[R];
  float alpha[R];

  const int qi = t.row_begin / group;
  for (int r = 0; r < R; ++r) {
    start_row(p, seq, t, group, r, q + r * hd, acc + r * hd);
    if constexpr (kQ8) quantize_query_q8(q + r * hd, hd, q8 + r * hd, q8d + r * nb);
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0f;
  }
  std::fill(prob, prob + R * kKeyChunk, 0.0f);  // lanes past a short chunk are read (masked)

  const PagedRows keys(lay, seq.k_pages, t.kv_head);
  const PagedRows values(lay, seq.v_pages, t.kv_head);
  const size_t rb = keys.row_bytes();
  const int64_t n_keys = seq.pos0 + qi + 1;
  const int64_t ws = window_start(p, n_keys - 1);
  const int64_t kb0 = ws / kKeyChunk * kKeyChunk;
  // Row pointers of this chunk (cur) and the next (ahead, prefetched one row per row used).
  const uint8_t* k_cur[kKeyChunk + 3];
  const uint8_t* v_cur[kKeyChunk];
  const uint8_t* k_ahead[kKeyChunk];
  const uint8_t* v_ahead[kKeyChunk];
  auto pointers = [&](int64_t from, int n, const uint8_t** kp, const uint8_t** vp) {
    keys.for_each_run(from, n, [&](int j0, const uint8_t* run, int count) {
      for (int j = 0; j < count; ++j) kp[j0 + j] = run + static_cast<size_t>(j) * rb;
    });
    values.for_each_run(from, n, [&](int j0, const uint8_t* run, int count) {
      for (int j = 0; j < count; ++j) vp[j0 + j] = run + static_cast<size_t>(j) * rb;
    });
  };
  const int n0 = static_cast<int>(std::min<int64_t>(kKeyChunk, n_keys - kb0));
  pointers(kb0, n0, k_cur, v_cur);
  for (int j = 0; j < n0; ++j) {
    prefetch_row(k_cur[j], rb);
    prefetch_row(v_cur[j], rb);
  }
  const auto* zero = reinterpret_cast<const uint8_t*>(kZeroRow);  // F16 zeros; Q8_0: scale 0, q 0
  constexpr int kS = kSpan<kType>;
  for (int64_t kb = kb0; kb < n_keys; kb += kKeyChunk) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeyChunk, n_keys - kb));
    const int n_ahead = static_cast<int>(std::clamp<int64_t>(n_keys - (kb + nk), 0, kKeyChunk));
    if (n_ahead > 0) pointers(kb + nk, n_ahead, k_ahead, v_ahead);
    for (int j = nk; j < ((nk + 3) & ~3); ++j) k_cur[j] = zero;

    for (int j = 0; j < nk; j += 4) {
      for (int a = j; a < std::min(j + 4, n_ahead); ++a) prefetch_row(k_ahead[a], rb);
      if constexpr (kQ8) {
        score_q8x4<R>(q8, q8d, k_cur + j, hd, prob + j, kKeyChunk);
      } else {
        __m256 s[R][4];
        for (int r = 0; r < R; ++r) {
          for (int c = 0; c < 4; ++c) s[r][c] = _mm256_setzero_ps();
        }
        for (int b = 0; b < hd; b += kS) {
          const __m256 c0 = span_scale<kType>(k_cur[j], b);
          const __m256 c1 = span_scale<kType>(k_cur[j + 1], b);
          const __m256 c2 = span_scale<kType>(k_cur[j + 2], b);
          const __m256 c3 = span_scale<kType>(k_cur[j + 3], b);
          for (int d = b; d < b + kS; d += 8) {
            const __m256 x0 = load8<kType>(k_cur[j], d, c0);
            const __m256 x1 = load8<kType>(k_cur[j + 1], d, c1);
            const __m256 x2 = load8<kType>(k_cur[j + 2], d, c2);
            const __m256 x3 = load8<kType>(k_cur[j + 3], d, c3);
            for (int r = 0; r < R; ++r) {
              const __m256 qv = _mm256_load_ps(q + r * hd + d);
              s[r][0] = _mm256_fmadd_ps(qv, x0, s[r][0]);
              s[r][1] = _mm256_fmadd_ps(qv, x1, s[r][1]);
              s[r][2] = _mm256_fmadd_ps(qv, x2, s[r][2]);
              s[r][3] = _mm256_fmadd_ps(qv, x3, s[r][3]);
            }
          }
        }
        for (int r = 0; r < R; ++r) _mm_store_ps(prob + r * kKeyChunk + j, reduce4(s[r][0], s[r][1], s[r][2], s[r][3]));
      }
    }
    const int lo = static_cast<int>(std::max<int64_t>(0, ws - kb));  // > 0 in the window's first chunk only
    for (int r = 0; r < R; ++r) {
      alpha[r] = softmax_chunk(prob + r * kKeyChunk, lo, nk, &m[r], &l[r], p.softcap);
    }

    for (int a = 0; a < n_ahead; ++a) prefetch_row(v_ahead[a], rb);
    if constexpr (kQ8) {
      // Each row's weight times the value's block scale (as tile_impl), then the int8 values
      // as floats: per key and 16 values, two widenings feed every row.
      alignas(32) float pw[R][kMaxHeadDim / 32][kKeyChunk];
      for (int j = 0; j < nk; ++j) {
        for (int b = 0; b < nb; ++b) {
          uint16_t h;
          std::memcpy(&h, v_cur[j] + b * 34, 2);
          const float vd = _cvtsh_ss(h);
          for (int r = 0; r < R; ++r) pw[r][b][j] = prob[r * kKeyChunk + j] * vd;
        }
      }
      for (int d = 0; d < hd; d += 16) {
        const int b = d / 32;
        __m256 c0[R], c1[R];
        for (int r = 0; r < R; ++r) {
          const __m256 va = _mm256_set1_ps(alpha[r]);
          c0[r] = _mm256_mul_ps(_mm256_load_ps(acc + r * hd + d), va);
          c1[r] = _mm256_mul_ps(_mm256_load_ps(acc + r * hd + d + 8), va);
        }
        for (int j = 0; j < nk; ++j) {
          const uint8_t* vq = v_cur[j] + b * 34 + 2 + d % 32;
          const __m256 x0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(vq))));
          const __m256 x1 =
              _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(vq + 8))));
          for (int r = 0; r < R; ++r) {
            const __m256 pj = _mm256_broadcast_ss(&pw[r][b][j]);
            c0[r] = _mm256_fmadd_ps(pj, x0, c0[r]);
            c1[r] = _mm256_fmadd_ps(pj, x1, c1[r]);
          }
        }
        for (int r = 0; r < R; ++r) {
          _mm256_store_ps(acc + r * hd + d, c0[r]);
          _mm256_store_ps(acc + r * hd + d + 8, c1[r]);
        }
      }
    }
    for (int d = 0; d < hd && !kQ8; d += 16) {
      const bool two = d + 16 <= hd;
      __m256 c0[R], c1[R];
      for (int r = 0; r < R; ++r) {
        const __m256 va = _mm256_set1_ps(alpha[r]);
        c0[r] = _mm256_mul_ps(_mm256_load_ps(acc + r * hd + d), va);
        c1[r] = two ? _mm256_mul_ps(_mm256_load_ps(acc + r * hd + d + 8), va) : _mm256_setzero_ps();
      }
      for (int j = 0; j < nk; ++j) {
        const __m256 c = span_scale<kType>(v_cur[j], d);  // d, d + 8: one Q8_0 block
        const __m256 x0 = load8<kType>(v_cur[j], d, c);
        const __m256 x1 = two ? load8<kType>(v_cur[j], d + 8, c) : _mm256_setzero_ps();
        for (int r = 0; r < R; ++r) {
          const __m256 pj = _mm256_broadcast_ss(prob + r * kKeyChunk + j);
          c0[r] = _mm256_fmadd_ps(pj, x0, c0[r]);
          c1[r] = _mm256_fmadd_ps(pj, x1, c1[r]);
        }
      }
      for (int r = 0; r < R; ++r) {
        _mm256_store_ps(acc + r * hd + d, c0[r]);
        if (two) _mm256_store_ps(acc + r * hd + d + 8, c1[r]);
      }
    }
    if (n_ahead > 0) {
      std::copy(k_ahead, k_ahead + n_ahead, k_cur);
      std::copy(v_ahead, v_ahead + n_ahead, v_cur);
    }
  }

  for (int r = 0; r < R; ++r) finish_row(seq, t, group, hd, r, acc + r * hd, l[r]);
}

template <DType kType>
void tile_typed(const AttentionParams& p, const AttentionSeq& seq, const AttentionTile& t) {
  const int group = p.n_head / p.layout.n_head_kv;
  const int rows = t.row_end - t.row_begin;
  if (t.row_begin / group == (t.row_end - 1) / group) {  // one query: a decode
    switch (rows) {
      case 1: return decode_tile<kType, 1>(p, seq, t);
      case 2: return decode_tile<kType, 2>(p, seq, t);
      case 3: return decode_tile<kType, 3>(p, seq, t);
      default: break;
    }
  }
  tile_impl<kType>(p, seq, t);
}

void tile_avx2(const AttentionParams& p, const AttentionSeq& seq, const AttentionTile& t) {
  if (p.layout.type == DType::kF16) {
    tile_typed<DType::kF16>(p, seq, t);
  } else {
    tile_typed<DType::kQ8_0>(p, seq, t);
  }
}

}  // namespace

void store_q8_0(const float* x, uint8_t* dst, int64_t n) { avx2::quantize_row_q8_0(x, dst, n, ActSide{}); }

const AttentionKernels kAttentionAvx2 = {"avx2", tile_avx2, store_f16, store_q8_0};

}  // namespace metro::kernels::detail
