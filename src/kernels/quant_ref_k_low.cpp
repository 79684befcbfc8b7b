// Scalar reference Q2_K and Q3_K, the 2- and 3-bit K-quants (layouts in quant_blocks.h).
//
// Dequantization follows ggml exactly (same float operations in the same order), so
// weights from GGUF files decode to the same values llama.cpp and gguf-py compute.
//
// At 2 and 3 bits the range-covering quantizers of the other K-quants (every value inside
// the levels, error at most half a step) waste most of the few levels on outliers, so these
// search: per 16-element sub-block, steps from the range-covering one down to 60% of it,
// each refined by least squares (levels fixed, step and offset fitted), the candidate with
// the least squared error kept; then the sub-block scales are quantized and the levels
// chosen again against the scales stored. A super-block whose largest error would exceed
// the documented bound (vec_dot_ref.cpp) is quantized range-covering instead, so the bound
// holds for every block while the squared error is far lower for almost all.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/fp16.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_ref.h"
#include "kernels/quant_ref_formats.h"

namespace metro::kernels {

namespace {

float h2f(uint16_t h) { return fp16_to_fp32(h); }

int clamp_int(int v, int lo, int hi) { return std::min(hi, std::max(lo, v)); }

constexpr int kSub = 16;  // sub-blocks per super-block, 16 elements each

// One sub-block's fit: x ~ step * q - offset with q in [0, levels] (offset 0 when
// symmetric: then q in [lo, levels + lo] with lo < 0 and step of either sign).
struct Fit {
  float step = 0.0f;
  float offset = 0.0f;
  double sse = 0.0;
};

// Importance weight of element i (1 without weights).
double wt(const float* w, int i) { return w != nullptr ? static_cast<double>(w[i]) : 1.0; }

// Squared error, each element's weighted by its importance (w: 16 weights, or null).
double sse_affine(const float* x, const float* w, float step, float offset, int qmin, int qmax) {
  double e = 0.0;
  const float inv = step != 0.0f ? 1.0f / step : 0.0f;
  for (int i = 0; i < 16; ++i) {
    const int q = clamp_int(static_cast<int>(std::lround((x[i] + offset) * inv)), qmin, qmax);
    const double d = static_cast<double>(x[i]) - (static_cast<double>(step) * q - offset);
    e += wt(w, i) * d * d;
  }
  return e;
}

// Least squares for step and offset with the levels q fixed; offset kept >= 0 (the format's
// min is subtracted) when `affine`, 0 otherwise.
void refine(const float* x, const float* w, int qmin, int qmax, bool affine, Fit* f) {
  const float inv = f->step != 0.0f ? 1.0f / f->step : 0.0f;
  double sw = 0, sq = 0, sqq = 0, sx = 0, sqx = 0;
  for (int i = 0; i < 16; ++i) {
    const int q = clamp_int(static_cast<int>(std::lround((x[i] + f->offset) * inv)), qmin, qmax);
    const double wi = wt(w, i);
    sw += wi;
    sq += wi * q;
    sqq += wi * static_cast<double>(q) * q;
    sx += wi * x[i];
    sqx += wi * static_cast<double>(q) * x[i];
  }
  double step = 0.0, b = 0.0;  // x ~ step * q + b
  const double det = sw * sqq - sq * sq;
  if (affine && det > 0.0) {
    step = (sw * sqx - sq * sx) / det;
    b = (sx - step * sq) / sw;
  }
  if (!affine || det <= 0.0 || b > 0.0) {
    b = 0.0;
    step = sqq > 0.0 ? sqx / sqq : 0.0;
  }
  if (affine && step < 0.0) return;
  Fit g{static_cast<float>(step), static_cast<float>(-b), 0.0};
  g.sse = sse_affine(x, w, g.step, g.offset, qmin, qmax);
  if (g.sse < f->sse) *f = g;
}

// Q2_K: q in 0..3, x ~ step * q - offset.
Fit fit_q2(const float* x, const float* w) {
  float lo = 0.0f, hi = 0.0f;
  for (int i = 0; i < 16; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  Fit best{(hi - lo) / 3.0f, -lo, 0.0};
  best.sse = sse_affine(x, w, best.step, best.offset, 0, 3);
  if (hi - lo <= 0.0f) return best;
  for (int t = 0; t <= 8; ++t) {
    // Shrink the covered range by up to 40%, from either end or both.
    const float shrink = 0.05f * static_cast<float>(t);
    for (int side = 0; side < 3; ++side) {
      const float l2 = side == 1 ? lo : lo + (hi - lo) * shrink * (side == 0 ? 0.5f : 1.0f);
      const float h2 = side == 2 ? hi : hi - (hi - lo) * shrink * (side == 0 ? 0.5f : 1.0f);
      Fit f{(h2 - l2) / 3.0f, std::max(0.0f, -l2), 0.0};
      if (f.step <= 0.0f) continue;
      f.sse = sse_affine(x, w, f.step, f.offset, 0, 3);
      for (int it = 0; it < 2; ++it) refine(x, w, 0, 3, true, &f);
      if (f.sse < best.sse) best = f;
    }
  }
  return best;
}

// Q3_K: x ~ step * v with v in -4..3; the step may be negative (then v spans -3..4 of x's
// sign), which puts the fourth level on the side of the largest magnitude.
Fit fit_q3(const float* x, const float* w) {
  float amax = 0.0f, ext = 0.0f;
  for (int i = 0; i < 16; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      ext = x[i];
    }
  }
  Fit best{amax / 3.0f, 0.0f, 0.0};
  best.sse = sse_affine(x, w, best.step, 0.0f, -4, 3);
  if (amax <= 0.0f) return best;
  for (int t = 0; t <= 12; ++t) {
    const float k = 3.0f + 0.125f * static_cast<float>(t);  // the extreme at level 3 .. 4.5
    Fit f{-ext / k, 0.0f, 0.0};
    f.sse = sse_affine(x, w, f.step, 0.0f, -4, 3);
    refine(x, w, -4, 3, false, &f);
    if (f.sse < best.sse) best = f;
  }
  return best;
}

double max_err(const float* x, const float* y) {
  double e = 0.0;
  for (int i = 0; i < kQKK; ++i) e = std::max(e, std::fabs(static_cast<double>(x[i]) - y[i]));
  return e;
}
double sum_sq_err(const float* x, const float* y, const float* w = nullptr) {
  double e = 0.0;
  for (int i = 0; i < kQKK; ++i) {
    const double d = static_cast<double>(x[i]) - y[i];
    e += wt(w, i) * d * d;
  }
  return e;
}
float abs_max(const float* x) {
  float a = 0.0f;
  for (int i = 0; i < kQKK; ++i) a = std::max(a, std::fabs(x[i]));
  return a;
}

// Levels of sub-block j against its stored step and offset.
void choose_levels_q2(const float* x, float step, float offset, BlockQ2_K* blk, int j) {
  const float inv = step > 0.0f ? 1.0f / step : 0.0f;
  for (int i = 0; i < 16; ++i) {
    const int q = clamp_int(static_cast<int>(std::lround((x[i] + offset) * inv)), 0, 3);
    set_q2_k_value(blk->qs, 16 * j + i, q);
  }
}

BlockQ2_K q2_block(const float* x, const float* w, bool search) {
  BlockQ2_K blk{};
  float steps[kSub], offs[kSub];
  float max_step = 0.0f, max_off = 0.0f;
  for (int j = 0; j < kSub; ++j) {
    const float* xs = x + 16 * j;
    float lo = 0.0f, hi = 0.0f;
    for (int i = 0; i < 16; ++i) {
      lo = std::min(lo, xs[i]);
      hi = std::max(hi, xs[i]);
    }
    if (search) {
      const Fit f = fit_q2(xs, w != nullptr ? w + 16 * j : nullptr);
      steps[j] = f.step;
      offs[j] = f.offset;
    } else {
      steps[j] = hi;  // the max, until the offset is rounded (below)
      offs[j] = -lo;
    }
    max_off = std::max(max_off, offs[j]);
  }
  int m[kSub];
  if (search) {
    blk.dmin = fp32_to_fp16(max_off / 15.0f);
    const float dmin = h2f(blk.dmin);
    for (int j = 0; j < kSub; ++j) {
      m[j] = dmin > 0.0f ? clamp_int(static_cast<int>(std::lround(offs[j] / dmin)), 0, 15) : 0;
      max_step = std::max(max_step, steps[j]);
    }
    blk.d = fp32_to_fp16(max_step / 15.0f);
    const float d = h2f(blk.d);
    for (int j = 0; j < kSub; ++j) {
      const int sc = d > 0.0f ? clamp_int(static_cast<int>(std::lround(steps[j] / d)), 0, 15) : 0;
      blk.scales[j] = static_cast<uint8_t>(sc | (m[j] << 4));
      choose_levels_q2(x + 16 * j, d * static_cast<float>(sc), dmin * static_cast<float>(m[j]), &blk, j);
    }
    return blk;
  }
  // Range-covering: the offset rounded up to the dmin grid, the step rounded up to the d
  // grid, so every value lies within the levels.
  blk.dmin = fp16_round_up(max_off / 15.0f);
  const float dmin = h2f(blk.dmin);
  float need[kSub];
  for (int j = 0; j < kSub; ++j) {
    m[j] = dmin > 0.0f ? clamp_int(static_cast<int>(std::ceil(offs[j] / dmin)), 0, 15) : 0;
    need[j] = (steps[j] + dmin * static_cast<float>(m[j])) / 3.0f;
    max_step = std::max(max_step, need[j]);
  }
  blk.d = fp16_round_up(max_step / 15.0f);
  const float d = h2f(blk.d);
  for (int j = 0; j < kSub; ++j) {
    const int sc = d > 0.0f ? clamp_int(static_cast<int>(std::ceil(need[j] / d)), 0, 15) : 0;
    blk.scales[j] = static_cast<uint8_t>(sc | (m[j] << 4));
    choose_levels_q2(x + 16 * j, d * static_cast<float>(sc), dmin * static_cast<float>(m[j]), &blk, j);
  }
  return blk;
}

BlockQ3_K q3_block(const float* x, const float* w, bool search) {
  BlockQ3_K blk{};
  float steps[kSub];
  float max_abs = 0.0f;
  for (int j = 0; j < kSub; ++j) {
    const float* xs = x + 16 * j;
    if (search) {
      steps[j] = fit_q3(xs, w != nullptr ? w + 16 * j : nullptr).step;
    } else {
      float lo = 0.0f, hi = 0.0f;
      for (int i = 0; i < 16; ++i) {
        lo = std::min(lo, xs[i]);
        hi = std::max(hi, xs[i]);
      }
      steps[j] = std::max(-lo / 4.0f, hi / 3.0f);  // both ends within -4..3 steps
    }
    max_abs = std::max(max_abs, std::fabs(steps[j]));
  }
  int sc[kSub];
  if (search) {
    blk.d = fp32_to_fp16(max_abs / 31.0f);
  } else {
    blk.d = fp16_round_up(max_abs / 31.0f);
  }
  const float d = h2f(blk.d);
  for (int j = 0; j < kSub; ++j) {
    if (d <= 0.0f) {
      sc[j] = 0;
    } else if (search) {
      sc[j] = clamp_int(static_cast<int>(std::lround(steps[j] / d)), -32, 31);
    } else {
      sc[j] = clamp_int(static_cast<int>(std::ceil(steps[j] / d)), 0, 31);
    }
    const float step = d * static_cast<float>(sc[j]);
    const float inv = step != 0.0f ? 1.0f / step : 0.0f;
    for (int i = 0; i < 16; ++i) {
      const int v = clamp_int(static_cast<int>(std::lround(x[16 * j + i] * inv)), -4, 3);
      set_q3_k_value(blk.hmask, blk.qs, 16 * j + i, v + 4);
    }
  }
  pack_q3_k_scales(sc, blk.scales);
  return blk;
}

// The searched block, or the range-covering one where the search's largest error would pass
// the format's documented bound.
// `importance`: n weights (one per column), or null.
template <class B, class Make>
void quant_k_low(const float* src, void* dst, int64_t n, DType t, Make make, const float* importance) {
  const double bound = roundtrip_error_bound(t);
  float y[kQKK];
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const float* x = src + b * kQKK;
    const float* w = importance != nullptr ? importance + b * kQKK : nullptr;
    B blk = make(x, w, true);
    dequantize_row_ref(t, &blk, y, kQKK);
    const double amax = abs_max(x);
    if (w != nullptr) {
      // Weighted: the least weighted error wins; the per-element bound is not kept (an
      // unimportant outlier may be clipped).
      const B cover = make(x, nullptr, false);
      float yc[kQKK];
      dequantize_row_ref(t, &cover, yc, kQKK);
      if (sum_sq_err(x, yc, w) < sum_sq_err(x, y, w)) blk = cover;
    } else if (max_err(x, y) > bound * amax) {
      const B cover = make(x, nullptr, false);
      float yc[kQKK];
      dequantize_row_ref(t, &cover, yc, kQKK);
      if (max_err(x, yc) <= bound * amax || sum_sq_err(x, yc) < sum_sq_err(x, y)) blk = cover;
    }
    store_block(dst, b, blk);
  }
}

}  // namespace

void dequant_q2_k_ref(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const auto blk = load_block<BlockQ2_K>(src, b);
    const float d = h2f(blk.d), dmin = h2f(blk.dmin);
    float* y = dst + b * kQKK;
    for (int j = 0; j < kSub; ++j) {
      const float dl = d * static_cast<float>(blk.scales[j] & 0x0F);
      const float ml = dmin * static_cast<float>(blk.scales[j] >> 4);
      for (int i = 0; i < 16; ++i) {
        y[16 * j + i] = dl * static_cast<float>(q2_k_value(blk.qs, 16 * j + i)) - ml;
      }
    }
  }
}

void dequant_q3_k_ref(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const auto blk = load_block<BlockQ3_K>(src, b);
    const float d = h2f(blk.d);
    float* y = dst + b * kQKK;
    for (int j = 0; j < kSub; ++j) {
      const float dl = d * static_cast<float>(q3_k_scale(blk.scales, j));
      for (int i = 0; i < 16; ++i) {
        y[16 * j + i] = dl * static_cast<float>(q3_k_value(blk.hmask, blk.qs, 16 * j + i) - 4);
      }
    }
  }
}

void quant_q2_k_ref(const float* src, void* dst, int64_t n, const float* importance) {
  quant_k_low<BlockQ2_K>(src, dst, n, DType::kQ2_K, q2_block, importance);
}

void quant_q3_k_ref(const float* src, void* dst, int64_t n, const float* importance) {
  quant_k_low<BlockQ3_K>(src, dst, n, DType::kQ3_K, q3_block, importance);
}

}  // namespace metro::kernels
