// Scalar reference block formats: float types and the 32-element block formats, plus the
// per-DType dispatch. The K-quants are in quant_ref_k.cpp, the dot products and error
// bounds in vec_dot_ref.cpp. Layouts are documented in quant_blocks.h.
//
// The 32-block quantizers reproduce ggml's reference quantizers bit for bit (same scale
// choice, same float operations, same rounding), so `metro quantize` writes the bytes
// llama.cpp would. The activation partners (Q8_1, Q8_K) only live in memory.
#include "kernels/quant_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/fp16.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_ref_formats.h"

namespace metro::kernels {

namespace {

float h2f(uint16_t h) { return fp16_to_fp32(h); }

// The value of largest magnitude (the first one, when two tie): its sign matters to the
// symmetric 4/5-bit formats, which map it to the extreme -8 / -16 level exactly.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (amax < std::fabs(x[i])) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  return max;
}

// Nibble packing shared by the 4/5-bit formats: element i (< 16) in the low nibble of
// qs[i], element i + 16 in the high nibble.
void pack_nibbles(const uint8_t q[32], uint8_t qs[16]) {
  for (int i = 0; i < 16; ++i) qs[i] = static_cast<uint8_t>((q[i] & 0x0F) | ((q[i + 16] & 0x0F) << 4));
}

void unpack_nibbles(const uint8_t qs[16], uint8_t q[32]) {
  for (int i = 0; i < 16; ++i) {
    q[i] = qs[i] & 0x0F;
    q[i + 16] = qs[i] >> 4;
  }
}

uint32_t pack_high_bits(const uint8_t q[32]) {
  uint32_t qh = 0;
  for (int i = 0; i < 32; ++i) qh |= static_cast<uint32_t>((q[i] >> 4) & 1u) << i;
  return qh;
}

}  // namespace

int8_t round_half_away_i8(float v) { return static_cast<int8_t>(std::lround(v)); }

void dequant_q4_0_ref(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const auto blk = load_block<BlockQ4_0>(src, b);
    const float d = h2f(blk.d);
    uint8_t q[32];
    unpack_nibbles(blk.qs, q);
    for (int i = 0; i < 32; ++i) dst[b * kQK + i] = static_cast<float>(q[i] - 8) * d;
  }
}

void quant_q4_0_ref(const float* src, void* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* x = src + b * kQK;
    const float d = signed_absmax(x, kQK) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t q[32];
    for (int i = 0; i < 32; ++i) q[i] = static_cast<uint8_t>(std::min(15, static_cast<int>(x[i] * id + 8.5f)));
    BlockQ4_0 blk;
    blk.d = fp32_to_fp16(d);
    pack_nibbles(q, blk.qs);
    store_block(dst, b, blk);
  }
}

// Q4_0 minimizing importance-weighted squared error: per block, steps from 75% to 105% of
// the range-covering one, each refined by weighted least squares with its levels fixed;
// the levels are then chosen again against the stored (fp16) step.
void quant_q4_0_weighted(const float* src, void* dst, int64_t n, const float* importance) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* x = src + b * kQK;
    const float* w = importance + b * kQK;
    const float d0 = signed_absmax(x, kQK) / -8.0f;
    auto levels = [&](float d, int q[32]) {
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      for (int i = 0; i < 32; ++i) q[i] = std::clamp(static_cast<int>(std::lround(x[i] * id)), -8, 7);
    };
    auto error = [&](float d, const int q[32]) {
      double e = 0.0;
      for (int i = 0; i < 32; ++i) {
        const double r = static_cast<double>(x[i]) - static_cast<double>(d) * q[i];
        e += static_cast<double>(w[i]) * r * r;
      }
      return e;
    };
    int q[32];
    float best = d0;
    levels(d0, q);
    double best_err = error(d0, q);
    for (int k = 0; k <= 12 && d0 != 0.0f; ++k) {
      float d = d0 * (0.75f + 0.025f * static_cast<float>(k));
      levels(d, q);
      double sqx = 0.0, sqq = 0.0;
      for (int i = 0; i < 32; ++i) {
        sqx += static_cast<double>(w[i]) * q[i] * x[i];
        sqq += static_cast<double>(w[i]) * q[i] * q[i];
      }
      for (const float cand : {d, sqq > 0.0 ? static_cast<float>(sqx / sqq) : d}) {
        levels(cand, q);
        const double e = error(cand, q);
        if (e < best_err) {
          best_err = e;
          best = cand;
        }
      }
    }
    BlockQ4_0 blk;
    blk.d = fp32_to_fp16(best);
    levels(h2f(blk.d), q);
    uint8_t u[32];
    for (int i = 0; i < 32; ++i) u[i] = static_cast<uint8_t>(q[i] + 8);
    pack_nibbles(u, blk.qs);
    store_block(dst, b, blk);
  }
}

void dequant_q4_1_ref(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const auto blk = load_block<BlockQ4_1>(src, b);
    const float d = h2f(blk.d), m = h2f(blk.m);
    uint8_t q[32];
    unpack_nibbles(blk.qs, q);
    for (int i = 0; i < 32; ++i) dst[b * kQK + i] = d * static_cast<float>(q[i]) + m;
  }
}

namespace {

// Q4_1 / Q5_1: min-max affine quantization to `levels` + 1 steps.
void quant_affine(const float* x, int levels, float* d_out, float* min_out, uint8_t q[32]) {
  float min = x[0], max = x[0];
  for (int i = 1; i < kQK; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
  }
  const float d = (max - min) / static_cast<float>(levels);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < kQK; ++i) {
    q[i] = static_cast<uint8_t>(std::min(levels, static_cast<int>((x[i] - min) * id + 0.5f)));
  }
  *d_out = d;
  *min_out = min;
}

}  // namespace

void quant_q4_1_ref(const float* src, void* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    float d, min;
    uint8_t q[32];
    quant_affine(src + b * kQK, 15, &d, &min, q);
    BlockQ4_1 blk;
    blk.d = fp32_to_fp16(d);
    blk.m = fp32_to_fp16(min);
    pack_nibbles(q, blk.qs);
    store_block(dst, b, blk);
  }
}

void dequant_q5_0_ref(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const auto blk = load_block<BlockQ5_0>(src, b);
    const float d = h2f(blk.d);
    uint32_t qh;
    std::memcpy(&qh, blk.qh, 4);
    uint8_t q[32];
    unpack_nibbles(blk.qs, q);
    for (int i = 0; i < 32; ++i) {
      const int v = q[i] | static_cast<int>(((qh >> i) & 1u) << 4);
      dst[b * kQK + i] = static_cast<float>(v - 16) * d;
    }
  }
}

void quant_q5_0_ref(const float* src, void* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* x = src + b * kQK;
    const float d = signed_absmax(x, kQK) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t q[32];
    for (int i = 0; i < 32; ++i) q[i] = static_cast<uint8_t>(std::min(31, static_cast<int>(x[i] * id + 16.5f)));
    BlockQ5_0 blk;
    blk.d = fp32_to_fp16(d);
    const uint32_t qh = pack_high_bits(q);
    std::memcpy(blk.qh, &qh, 4);
    pack_nibbles(q, blk.qs);
    store_block(dst, b, blk);
  }
}

void dequant_q5_1_ref(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const auto blk = load_block<BlockQ5_1>(src, b);
    const float d = h2f(blk.d), m = h2f(blk.m);
    uint32_t qh;
    std::memcpy(&qh, blk.qh, 4);
    uint8_t q[32];
    unpack_nibbles(blk.qs, q);
    for (int i = 0; i < 32; ++i) {
      const int v = q[i] | static_cast<int>(((qh >> i) & 1u) << 4);
      dst[b * kQK + i] = d * static_cast<float>(v) + m;
    }
  }
}

void quant_q5_1_ref(const float* src, void* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    float d, min;
    uint8_t q[32];
    quant_affine(src + b * kQK, 31, &d, &min, q);
    BlockQ5_1 blk;
    blk.d = fp32_to_fp16(d);
    blk.m = fp32_to_fp16(min);
    const uint32_t qh = pack_high_bits(q);
    std::memcpy(blk.qh, &qh, 4);
    pack_nibbles(q, blk.qs);
    store_block(dst, b, blk);
  }
}

void dequant_q8_0_ref(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const auto blk = load_block<BlockQ8_0>(src, b);
    const float d = h2f(blk.d);
    for (int i = 0; i < 32; ++i) dst[b * kQK + i] = static_cast<float>(blk.qs[i]) * d;
  }
}

namespace {

// Symmetric 8-bit: d = amax / 127, q = round-half-away(x / d); returns d (float).
float quant_sym8(const float* x, int8_t q[32]) {
  float amax = 0.0f;
  for (int i = 0; i < kQK; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < kQK; ++i) q[i] = round_half_away_i8(x[i] * id);
  return d;
}

}  // namespace

void quant_q8_0_ref(const float* src, void* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    BlockQ8_0 blk;
    blk.d = fp32_to_fp16(quant_sym8(src + b * kQK, blk.qs));
    store_block(dst, b, blk);
  }
}

void dequant_q8_1_ref(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const auto blk = load_block<BlockQ8_1>(src, b);
    const float d = h2f(blk.d);
    for (int i = 0; i < 32; ++i) dst[b * kQK + i] = static_cast<float>(blk.qs[i]) * d;
  }
}

void quant_q8_1_ref(const float* src, void* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    BlockQ8_1 blk;
    const float d = quant_sym8(src + b * kQK, blk.qs);
    int sum = 0;
    for (int i = 0; i < 32; ++i) sum += blk.qs[i];
    blk.d = fp32_to_fp16(d);
    blk.s = fp32_to_fp16(static_cast<float>(sum) * d);
    store_block(dst, b, blk);
  }
}

void dequantize_row_ref(DType t, const void* src, float* dst, int64_t n) {
  METRO_CHECK(n % traits(t).block_size == 0);
  const auto* s = static_cast<const uint8_t*>(src);
  switch (t) {
    case DType::kF32: std::memcpy(dst, s, static_cast<size_t>(n) * 4); return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = fp16_to_fp32(h);
      }
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = bf16_to_fp32(h);
      }
      return;
    case DType::kQ8_0: dequant_q8_0_ref(s, dst, n); return;
    case DType::kQ4_0: dequant_q4_0_ref(s, dst, n); return;
    case DType::kQ4_1: dequant_q4_1_ref(s, dst, n); return;
    case DType::kQ5_0: dequant_q5_0_ref(s, dst, n); return;
    case DType::kQ5_1: dequant_q5_1_ref(s, dst, n); return;
    case DType::kQ2_K: dequant_q2_k_ref(s, dst, n); return;
    case DType::kQ3_K: dequant_q3_k_ref(s, dst, n); return;
    case DType::kQ4_K: dequant_q4_k_ref(s, dst, n); return;
    case DType::kQ5_K: dequant_q5_k_ref(s, dst, n); return;
    case DType::kQ6_K: dequant_q6_k_ref(s, dst, n); return;
    case DType::kQ8_1: dequant_q8_1_ref(s, dst, n); return;
    case DType::kQ8_K: dequant_q8_k_ref(s, dst, n); return;
    case DType::kCount: break;
  }
  METRO_CHECK_MSG(false, "dequantize_row_ref: not a DType");
}

void quantize_row_ref(DType t, const float* src, void* dst, int64_t n) {
  METRO_CHECK(n % traits(t).block_size == 0);
  auto* d = static_cast<uint8_t*>(dst);
  switch (t) {
    case DType::kF32: std::memcpy(d, src, static_cast<size_t>(n) * 4); return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(src[i]);
        std::memcpy(d + 2 * i, &h, 2);
      }
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(src[i]);
        std::memcpy(d + 2 * i, &h, 2);
      }
      return;
    case DType::kQ8_0: quant_q8_0_ref(src, d, n); return;
    case DType::kQ4_0: quant_q4_0_ref(src, d, n); return;
    case DType::kQ4_1: quant_q4_1_ref(src, d, n); return;
    case DType::kQ5_0: quant_q5_0_ref(src, d, n); return;
    case DType::kQ5_1: quant_q5_1_ref(src, d, n); return;
    case DType::kQ2_K: quant_q2_k_ref(src, d, n); return;
    case DType::kQ3_K: quant_q3_k_ref(src, d, n); return;
    case DType::kQ4_K: quant_q4_k_ref(src, d, n); return;
    case DType::kQ5_K: quant_q5_k_ref(src, d, n); return;
    case DType::kQ6_K: quant_q6_k_ref(src, d, n); return;
    case DType::kQ8_1: quant_q8_1_ref(src, d, n); return;
    case DType::kQ8_K: quant_q8_k_ref(src, d, n); return;
    case DType::kCount: break;
  }
  METRO_CHECK_MSG(false, "quantize_row_ref: not a DType");
}

bool quantize_takes_importance(DType t) { return t == DType::kQ2_K || t == DType::kQ3_K || t == DType::kQ4_0; }

void quantize_row_ref_weighted(DType t, const float* src, void* dst, int64_t n, const float* importance) {
  METRO_CHECK(n % traits(t).block_size == 0);
  switch (t) {
    case DType::kQ2_K: quant_q2_k_ref(src, dst, n, importance); return;
    case DType::kQ3_K: quant_q3_k_ref(src, dst, n, importance); return;
    case DType::kQ4_0: quant_q4_0_weighted(src, dst, n, importance); return;
    default: quantize_row_ref(t, src, dst, n); return;
  }
}

}  // namespace metro::kernels
