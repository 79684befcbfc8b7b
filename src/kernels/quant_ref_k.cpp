// Scalar reference K-quants (Q4_K, Q5_K, Q6_K) and their activation partner Q8_K.
//
// Dequantization follows ggml exactly (same float operations in the same order), so
// weights from GGUF files decode to the same values llama.cpp and gguf-py compute.
//
// The quantizers are simpler than ggml's (no iterative search for the best scales): each
// sub-block gets the smallest scale on the integer grid whose levels cover its range,
// so no value is ever clamped and the error is at most half a step. They are valid
// GGUF (llama.cpp reads them) but a little less accurate than llama-quantize's output;
// the bounds are derived in vec_dot_ref.cpp next to roundtrip_error_bound.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/fp16.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_ref_formats.h"

namespace metro::kernels {

uint16_t fp16_round_up(float v) {
  uint16_t h = fp32_to_fp16(v);
  if (fp16_to_fp32(h) < v && h < 0x7bffu) ++h;  // positive: the next bit pattern is larger
  return h;
}

namespace {

float h2f(uint16_t h) { return fp16_to_fp32(h); }

int clamp_int(int v, int lo, int hi) { return std::min(hi, std::max(lo, v)); }

// Q4_K / Q5_K share their scale search: 8 sub-blocks of 32 values, each mapped to
// d*sc[j]*q - dmin*m[j] with q in [0, levels]. Writes d, dmin, the 6-bit sc/m and q.
struct KQuantAffine {
  uint16_t d, dmin;
  uint8_t sc[8], m[8];
  uint8_t q[256];
};

KQuantAffine quant_k_affine(const float* x, int levels) {
  KQuantAffine r{};
  float off[8], hi[8];
  float max_off = 0.0f;
  for (int j = 0; j < 8; ++j) {
    float lo = 0.0f, h = x[32 * j];
    for (int i = 0; i < 32; ++i) {
      lo = std::min(lo, x[32 * j + i]);
      h = std::max(h, x[32 * j + i]);
    }
    off[j] = -lo;  // >= 0: the min is subtracted
    hi[j] = h;
    max_off = std::max(max_off, off[j]);
  }
  r.dmin = fp16_round_up(max_off / 63.0f);
  const float dmin = h2f(r.dmin);
  float m1[8], need[8];
  float max_need = 0.0f;
  for (int j = 0; j < 8; ++j) {
    // Round the min up so the lowest level is at or below the sub-block's smallest value.
    r.m[j] = dmin > 0.0f ? static_cast<uint8_t>(clamp_int(static_cast<int>(std::ceil(off[j] / dmin)), 0, 63)) : 0;
    m1[j] = dmin * static_cast<float>(r.m[j]);
    need[j] = (hi[j] + m1[j]) / static_cast<float>(levels);  // the step that reaches the max
    max_need = std::max(max_need, need[j]);
  }
  r.d = fp16_round_up(max_need / 63.0f);
  const float d = h2f(r.d);
  for (int j = 0; j < 8; ++j) {
    r.sc[j] = d > 0.0f ? static_cast<uint8_t>(clamp_int(static_cast<int>(std::ceil(need[j] / d)), 0, 63)) : 0;
    const float d1 = d * static_cast<float>(r.sc[j]);
    const float id1 = d1 > 0.0f ? 1.0f / d1 : 0.0f;
    for (int i = 0; i < 32; ++i) {
      const int q = static_cast<int>(std::lround((x[32 * j + i] + m1[j]) * id1));
      r.q[32 * j + i] = static_cast<uint8_t>(clamp_int(q, 0, levels));
    }
  }
  return r;
}

}  // namespace

void dequant_q4_k_ref(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const auto blk = load_block<BlockQ4_K>(src, b);
    const float d = h2f(blk.d), dmin = h2f(blk.dmin);
    float* y = dst + b * kQKK;
    for (int c = 0; c < 4; ++c) {
      uint8_t sc0, m0, sc1, m1;
      unpack_scale_min_k4(blk.scales, 2 * c, &sc0, &m0);
      unpack_scale_min_k4(blk.scales, 2 * c + 1, &sc1, &m1);
      const float d0 = d * sc0, dm0 = dmin * m0, d1 = d * sc1, dm1 = dmin * m1;
      for (int l = 0; l < 32; ++l) {
        const uint8_t q = blk.qs[32 * c + l];
        y[64 * c + l] = d0 * static_cast<float>(q & 0x0F) - dm0;
        y[64 * c + 32 + l] = d1 * static_cast<float>(q >> 4) - dm1;
      }
    }
  }
}

void quant_q4_k_ref(const float* src, void* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const KQuantAffine r = quant_k_affine(src + b * kQKK, 15);
    BlockQ4_K blk;
    blk.d = r.d;
    blk.dmin = r.dmin;
    pack_scale_min_k4(r.sc, r.m, blk.scales);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        blk.qs[32 * c + l] = static_cast<uint8_t>(r.q[64 * c + l] | (r.q[64 * c + 32 + l] << 4));
      }
    }
    store_block(dst, b, blk);
  }
}

void dequant_q5_k_ref(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const auto blk = load_block<BlockQ5_K>(src, b);
    const float d = h2f(blk.d), dmin = h2f(blk.dmin);
    float* y = dst + b * kQKK;
    for (int c = 0; c < 4; ++c) {
      uint8_t sc0, m0, sc1, m1;
      unpack_scale_min_k4(blk.scales, 2 * c, &sc0, &m0);
      unpack_scale_min_k4(blk.scales, 2 * c + 1, &sc1, &m1);
      const float d0 = d * sc0, dm0 = dmin * m0, d1 = d * sc1, dm1 = dmin * m1;
      for (int l = 0; l < 32; ++l) {
        const uint8_t q = blk.qs[32 * c + l];
        const int h0 = (blk.qh[l] >> (2 * c)) & 1, h1 = (blk.qh[l] >> (2 * c + 1)) & 1;
        y[64 * c + l] = d0 * static_cast<float>((q & 0x0F) | (h0 << 4)) - dm0;
        y[64 * c + 32 + l] = d1 * static_cast<float>((q >> 4) | (h1 << 4)) - dm1;
      }
    }
  }
}

void quant_q5_k_ref(const float* src, void* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const KQuantAffine r = quant_k_affine(src + b * kQKK, 31);
    BlockQ5_K blk;
    blk.d = r.d;
    blk.dmin = r.dmin;
    pack_scale_min_k4(r.sc, r.m, blk.scales);
    std::memset(blk.qh, 0, sizeof blk.qh);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t q0 = r.q[64 * c + l], q1 = r.q[64 * c + 32 + l];
        blk.qs[32 * c + l] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
        blk.qh[l] = static_cast<uint8_t>(blk.qh[l] | ((q0 >> 4) << (2 * c)) | ((q1 >> 4) << (2 * c + 1)));
      }
    }
    store_block(dst, b, blk);
  }
}

void dequant_q6_k_ref(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const auto blk = load_block<BlockQ6_K>(src, b);
    const float d = h2f(blk.d);
    float* y = dst + b * kQKK;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = blk.ql + 64 * h;
      const uint8_t* qh = blk.qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        const int q[4] = {
            ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32,
            ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32,
            ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32,
            ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32,
        };
        for (int t = 0; t < 4; ++t) {
          const int e = 128 * h + 32 * t + l;
          y[e] = d * static_cast<float>(blk.scales[e / 16]) * static_cast<float>(q[t]);
        }
      }
    }
  }
}

void quant_q6_k_ref(const float* src, void* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const float* x = src + b * kQKK;
    // Symmetric per 16-element sub-block: levels -31..31 (the format's -32 stays unused,
    // which keeps the step choice simple and the error at half a step).
    float s[16];
    float max_s = 0.0f;
    for (int j = 0; j < 16; ++j) {
      float amax = 0.0f;
      for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[16 * j + i]));
      s[j] = amax / 31.0f;
      max_s = std::max(max_s, s[j]);
    }
    BlockQ6_K blk;
    blk.d = fp16_round_up(max_s / 127.0f);
    const float d = h2f(blk.d);
    uint8_t q[256];
    for (int j = 0; j < 16; ++j) {
      const int sc = d > 0.0f ? clamp_int(static_cast<int>(std::ceil(s[j] / d)), 0, 127) : 0;
      blk.scales[j] = static_cast<int8_t>(sc);
      const float d1 = d * static_cast<float>(sc);
      const float id1 = d1 > 0.0f ? 1.0f / d1 : 0.0f;
      for (int i = 0; i < 16; ++i) {
        const int v = static_cast<int>(std::lround(x[16 * j + i] * id1));
        q[16 * j + i] = static_cast<uint8_t>(clamp_int(v, -32, 31) + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const uint8_t* qq = q + 128 * h;
      for (int l = 0; l < 32; ++l) {
        blk.ql[64 * h + l] = static_cast<uint8_t>((qq[l] & 0x0F) | ((qq[l + 64] & 0x0F) << 4));
        blk.ql[64 * h + l + 32] = static_cast<uint8_t>((qq[l + 32] & 0x0F) | ((qq[l + 96] & 0x0F) << 4));
        blk.qh[32 * h + l] = static_cast<uint8_t>((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) |
                                                  ((qq[l + 64] >> 4) << 4) | ((qq[l + 96] >> 4) << 6));
      }
    }
    store_block(dst, b, blk);
  }
}

void dequant_q8_k_ref(const void* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const auto blk = load_block<BlockQ8_K>(src, b);
    for (int i = 0; i < kQKK; ++i) dst[b * kQKK + i] = blk.d * static_cast<float>(blk.qs[i]);
  }
}

// Symmetric like Q8_0 but with a float scale and 16-element sums for the K-quant mins.
void quant_q8_k_ref(const float* src, void* dst, int64_t n) {
  for (int64_t b = 0; b < n / kQKK; ++b) {
    const float* x = src + b * kQKK;
    float amax = 0.0f;
    for (int i = 0; i < kQKK; ++i) amax = std::max(amax, std::fabs(x[i]));
    BlockQ8_K blk;
    blk.d = amax / 127.0f;
    const float id = blk.d != 0.0f ? 1.0f / blk.d : 0.0f;
    for (int i = 0; i < kQKK; ++i) blk.qs[i] = round_half_away_i8(x[i] * id);
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += blk.qs[16 * j + i];
      blk.bsums[j] = static_cast<int16_t>(sum);
    }
    store_block(dst, b, blk);
  }
}

}  // namespace metro::kernels
