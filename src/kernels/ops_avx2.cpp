// AVX2+FMA elementwise ops. Tails (n % 8) go through masked loads and stores so every
// element takes the same arithmetic path as the vector body.
//
// Error budgets (u = 2^-24, tested in ops_test.cpp):
//   dot_f32, rms_norm sum:  4 accumulators x 8 lanes, so each partial sum adds about n/32
//                           terms: |error| <= (n/32 + 8) u sum|a_i b_i|.
//   silu/swiglu/gelu:       one exp (kExpMaxRelError) and a few roundings per element.
//   softmax:                exp of (x - max) with the subtraction rounded (u |x - max|),
//                           a sum over 8 lanes (n/8 + 4) u, one division.
//   add/mul/scale:          one rounding, bit-identical to the reference.
#include <cmath>
#include <limits>

#include "kernels/ops_avx2.h"
#include "kernels/ops_table.h"

namespace metro::kernels::avx2 {

namespace {
__m256 load_tail(const float* p, int64_t count) {
  return _mm256_maskload_ps(p, first_lanes(count));
}
void store_tail(float* p, int64_t count, __m256 v) {
  _mm256_maskstore_ps(p, first_lanes(count), v);
}

float dot(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps();
  __m256 acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  }
  if (i < n) acc1 = _mm256_fmadd_ps(load_tail(a + i, n - i), load_tail(b + i, n - i), acc1);
  return hsum_ps(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
}

void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  const float mean_sq = dot(x, x, n) / static_cast<float>(n);
  const __m256 inv = _mm256_set1_ps(1.0f / std::sqrt(mean_sq + eps));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), inv);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(v, _mm256_loadu_ps(weight + i)));
  }
  if (i < n) {
    const __m256 v = _mm256_mul_ps(load_tail(x + i, n - i), inv);
    store_tail(y + i, n - i, _mm256_mul_ps(v, load_tail(weight + i, n - i)));
  }
}

// silu(g) = g / (1 + e^-g); large negative g gives e^-g = inf and a signed zero, as it should.
__m256 silu8(__m256 g) {
  const __m256 e = exp(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 s = silu8(_mm256_loadu_ps(gate + i));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  if (i < n) {
    const __m256 s = silu8(load_tail(gate + i, n - i));
    store_tail(out + i, n - i, _mm256_mul_ps(s, load_tail(up + i, n - i)));
  }
}

void silu(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, silu8(_mm256_loadu_ps(x + i)));
  if (i < n) store_tail(y + i, n - i, silu8(load_tail(x + i, n - i)));
}

// 0.5 x (1 + tanh(z)) = x / (1 + e^(-2z)), z = sqrt(2/pi) (x + 0.044715 x^3): the sigmoid
// form has no cancellation where tanh(z) is near -1.
__m256 gelu8(__m256 x) {
  const __m256 c1 = _mm256_set1_ps(-1.5957691216057308f);  // -2 sqrt(2/pi)
  const __m256 c3 = _mm256_set1_ps(-0.0713548162726f);     // -2 sqrt(2/pi) 0.044715
  const __m256 x2 = _mm256_mul_ps(x, x);
  const __m256 m2z = _mm256_mul_ps(x, _mm256_fmadd_ps(c3, x2, c1));
  const __m256 e = exp(m2z);
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

void softcap_row(float* x, int64_t n, float cap) {
  const __m256 c = _mm256_set1_ps(cap), ic = _mm256_set1_ps(1.0f / cap);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, softcap(_mm256_loadu_ps(x + i), c, ic));
  if (i < n) store_tail(x + i, n - i, softcap(load_tail(x + i, n - i), c, ic));
}

void gelu(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, gelu8(_mm256_loadu_ps(x + i)));
  if (i < n) store_tail(y + i, n - i, gelu8(load_tail(x + i, n - i)));
}

// The largest of x[0, n) (-inf when n is 0). NaN entries are skipped, as std::fmax in the
// references does: max_ps returns its second operand when the first is NaN. Four chains,
// since max has a latency of 4 cycles and a throughput of 2 per cycle.
float max_skipping_nan(const float* x, int64_t n) {
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 m0 = neg_inf, m1 = neg_inf, m2 = neg_inf, m3 = neg_inf;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
    m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
    m2 = _mm256_max_ps(_mm256_loadu_ps(x + i + 16), m2);
    m3 = _mm256_max_ps(_mm256_loadu_ps(x + i + 24), m3);
  }
  for (; i + 8 <= n; i += 8) m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
  if (i < n) {
    const __m256i m = first_lanes(n - i);
    m1 = _mm256_max_ps(_mm256_blendv_ps(neg_inf, _mm256_maskload_ps(x + i, m), _mm256_castsi256_ps(m)), m1);
  }
  return hmax_ps(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
}

void exp_f32(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp(_mm256_loadu_ps(x + i)));
  if (i < n) store_tail(y + i, n - i, exp(load_tail(x + i, n - i)));
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  const __m256 vmax = _mm256_set1_ps(max_skipping_nan(x, n));
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
    _mm256_storeu_ps(x + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (i < n) {
    const __m256i m = first_lanes(n - i);
    const __m256 e = _mm256_and_ps(
        exp(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), vmax)), _mm256_castsi256_ps(m));
    _mm256_maskstore_ps(x + i, m, e);
    sum = _mm256_add_ps(sum, e);
  }
  const __m256 inv = _mm256_set1_ps(1.0f / hsum_ps(sum));
  for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  if (i < n) store_tail(x + i, n - i, _mm256_mul_ps(load_tail(x + i, n - i), inv));
}

float softmax_weights(const float* x, float* y, int64_t n, float scale) {
  const float mx = max_skipping_nan(x, n);
  const __m256 vmax = _mm256_set1_ps(mx), vs = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, exp(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax), vs)));
  }
  if (i < n) store_tail(y + i, n - i, exp(_mm256_mul_ps(_mm256_sub_ps(load_tail(x + i, n - i), vmax), vs)));
  return mx;
}

int64_t argmax(const float* x, int64_t n) {
  // The largest value first, then the first index that holds it.
  const float mx = max_skipping_nan(x, n);
  const __m256 vmax = _mm256_set1_ps(mx);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vmax, _CMP_EQ_OQ));
    if (hit != 0) return i + __builtin_ctz(static_cast<unsigned>(hit));
  }
  for (; i < n; ++i) {
    if (x[i] == mx) return i;
  }
  return 0;  // every entry NaN
}

void add(const float* a, const float* b, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  }
  if (i < n) store_tail(out + i, n - i, _mm256_add_ps(load_tail(a + i, n - i), load_tail(b + i, n - i)));
}

void mul(const float* a, const float* b, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  }
  if (i < n) store_tail(out + i, n - i, _mm256_mul_ps(load_tail(a + i, n - i), load_tail(b + i, n - i)));
}

void scale(float* x, float s, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
  if (i < n) store_tail(x + i, n - i, _mm256_mul_ps(load_tail(x + i, n - i), vs));
}

// Pairs are rotated 4 (normal order) or 8 (NeoX order) at a time; the rest one by one
// with the same float arithmetic.
void rope_rotate(float* x, int n_head, int head_dim, int n_rot, RopeMode mode, const float* cos,
                 const float* sin) {
  const int half = n_rot / 2;
  for (int h = 0; h < n_head; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    int i = 0;
    if (mode == RopeMode::kNormal) {
      const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
      for (; i + 4 <= half; i += 4) {
        const __m256 c = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cos + i)), dup);
        const __m256 s = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sin + i)), dup);
        const __m256 xv = _mm256_loadu_ps(v + 2 * i);
        const __m256 swapped = _mm256_permute_ps(xv, 0xB1);  // (x1, x0, x3, x2, ...)
        // even lanes x0 c - x1 s, odd lanes x1 c + x0 s
        _mm256_storeu_ps(v + 2 * i, _mm256_fmaddsub_ps(xv, c, _mm256_mul_ps(swapped, s)));
      }
      for (; i < half; ++i) {
        const float x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = std::fma(x0, cos[i], -(x1 * sin[i]));
        v[2 * i + 1] = std::fma(x1, cos[i], x0 * sin[i]);
      }
    } else {
      for (; i + 8 <= half; i += 8) {
        const __m256 c = _mm256_loadu_ps(cos + i);
        const __m256 s = _mm256_loadu_ps(sin + i);
        const __m256 a = _mm256_loadu_ps(v + i);
        const __m256 b = _mm256_loadu_ps(v + half + i);
        _mm256_storeu_ps(v + i, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)));
        _mm256_storeu_ps(v + half + i, _mm256_fmadd_ps(b, c, _mm256_mul_ps(a, s)));
      }
      for (; i < half; ++i) {
        const float a = v[i], b = v[half + i];
        v[i] = std::fma(a, cos[i], -(b * sin[i]));
        v[half + i] = std::fma(b, cos[i], a * sin[i]);
      }
    }
  }
}

}  // namespace

}  // namespace metro::kernels::avx2

namespace metro::kernels::detail {
const OpsTable kOpsAvx2 = {
    "avx2",           avx2::rms_norm, avx2::swiglu, avx2::silu,
    avx2::gelu,       avx2::softmax,  avx2::add,    avx2::mul,
    avx2::scale,      avx2::dot,      avx2::exp_f32, avx2::softmax_weights,
    avx2::argmax,     avx2::rope_rotate, avx2::softcap_row,
};
}  // namespace metro::kernels::detail
