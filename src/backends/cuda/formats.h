// The block formats as the CUDA backend's kernels read and write them, as functions that
// compile for the host and for the device alike: the host compiler builds them into the
// CPU test (tests/backends/cuda_formats_test.cpp) that checks them against the scalar
// references of kernels/, so a format mistake shows on a machine without a GPU.
//
// Weights are stored in "padded" blocks: each GGUF block with two zero bytes inserted where
// that makes every 4-byte field 4-byte aligned (Q8_0, Q4_0 and Q5_0 get them after the
// f16 scale, Q6_K at the end), so kernels read quants as aligned 32-bit words. A row of n
// elements is n / block_size padded blocks. Q4_1, Q5_1, Q4_K and Q5_K are aligned as they are.
//
// Activations are quantized to the weight's dot partner exactly as quantize_row_ref does
// (kernels/quant_ref.h), into device blocks that keep the same values with aligned fields:
//   Q8_0 partner: qs[32] int8, then d as a float (the f16-rounded scale)      36 bytes
//   Q8_1 partner: qs[32], d, s as floats (both f16-rounded)                   40 bytes
//   Q8_K partner: qs[256], d float, bsums[16] int16                           292 bytes
//
// Arithmetic that must be bit-identical to the references (dequantization, the KV page
// writers, quantizers) uses mul_rn/add_rn, which the device compiler may not contract
// into a fused multiply-add.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/dtype.h"

#if defined(__CUDACC__)
#define METRO_HD __host__ __device__ __forceinline__
#else
#define METRO_HD inline
#endif

namespace metro::backends::cuda {

using kernels::DType;

// ---- bits and scalar conversions ------------------------------------------------------

METRO_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

METRO_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

METRO_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

METRO_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

METRO_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

METRO_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// Little-endian loads; p aligned to the load's size.
METRO_HD uint16_t load_u16(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint16_t*>(p);
#else
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
#endif
}

METRO_HD uint32_t load_u32(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}

// A 32-bit word at a 2-byte aligned address (KV pages' Q8_0 blocks are 34 bytes).
METRO_HD uint32_t load_u32_a2(const uint8_t* p) {
  return static_cast<uint32_t>(load_u16(p)) | (static_cast<uint32_t>(load_u16(p + 2)) << 16);
}

METRO_HD float load_f32(const uint8_t* p) { return bits_f32(load_u32(p)); }

METRO_HD float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: mant * 2^-24, exact in float
      bits = f32_bits(static_cast<float>(mant) * 0x1p-24f) | sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  return bits_f32(bits);
}

// Round to nearest even, overflow to infinity, NaN kept: base/fp16.h's fp32_to_fp16.
METRO_HD uint16_t f32_to_fp16(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (abs < 0x38800000u) {
    const float a = mul_rn(bits_f32(abs), 0x1p24f);
    uint32_t m = static_cast<uint32_t>(a);
    const float rem = sub_rn(a, static_cast<float>(m));
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  const uint32_t e = ((abs >> 23) - 112) << 10;
  const uint32_t m = (abs >> 13) & 0x3ffu;
  uint32_t h = e | m;
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

METRO_HD float bf16_to_f32(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }

METRO_HD float load_fp16(const uint8_t* p) { return fp16_to_f32(load_u16(p)); }

// Four signed bytes of a and b multiplied pairwise and added to c.
METRO_HD int dot4(uint32_t a, uint32_t b, int c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(static_cast<int>(a), static_cast<int>(b), c);
#else
  for (int i = 0; i < 4; ++i) {
    c += static_cast<int>(static_cast<int8_t>(a >> (8 * i))) * static_cast<int>(static_cast<int8_t>(b >> (8 * i)));
  }
  return c;
#endif
}

// Bytewise a - b modulo 256 (no borrow between bytes).
METRO_HD uint32_t vsub4(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __vsub4(a, b);
#else
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= ((((a >> (8 * i)) & 0xffu) - ((b >> (8 * i)) & 0xffu)) & 0xffu) << (8 * i);
  return r;
#endif
}

// Bit k of `bits` (k < 4) to bit 4 of byte k: the fifth bit of four 5-bit quants.
METRO_HD uint32_t spread4(uint32_t bits) {
  return ((bits & 1u) << 4) | ((bits & 2u) << 11) | ((bits & 4u) << 18) | ((bits & 8u) << 25);
}

// round(v) halves away from zero, as an int8 (|v| < 127.5): kernels' round_half_away_i8.
METRO_HD int8_t round_away_i8(float v) {
#if defined(__CUDA_ARCH__)
  return static_cast<int8_t>(static_cast<int>(roundf(v)));
#else
  return static_cast<int8_t>(static_cast<int>(std::round(v)));
#endif
}

// ---- padded weight blocks -------------------------------------------------------------

struct BlockGeom {
  int elems;       // elements per block
  int src_bytes;   // GGUF bytes per block
  int bytes;       // padded bytes per block
  int pad_at;      // where the two zero bytes go (src_bytes: none or at the end)
};

METRO_HD BlockGeom block_geom(DType t) {
  switch (t) {
    case DType::kF32: return {1, 4, 4, 4};
    case DType::kF16: return {1, 2, 2, 2};
    case DType::kBF16: return {1, 2, 2, 2};
    case DType::kQ8_0: return {32, 34, 36, 2};
    case DType::kQ4_0: return {32, 18, 20, 2};
    case DType::kQ4_1: return {32, 20, 20, 20};
    case DType::kQ5_0: return {32, 22, 24, 2};
    case DType::kQ5_1: return {32, 24, 24, 24};
    case DType::kQ4_K: return {256, 144, 144, 144};
    case DType::kQ5_K: return {256, 176, 176, 176};
    case DType::kQ6_K: return {256, 210, 212, 210};
    default: return {0, 0, 0, 0};  // not a weight type of this backend
  }
}

// Bytes of one padded row of n elements.
METRO_HD int64_t padded_row_bytes(DType t, int64_t n) {
  const BlockGeom g = block_geom(t);
  return n / g.elems * g.bytes;
}

// One GGUF row (n elements) into its padded form (dst: padded_row_bytes(t, n) bytes).
inline void pad_row(DType t, const uint8_t* src, uint8_t* dst, int64_t n) {
  const BlockGeom g = block_geom(t);
  const int64_t nb = n / g.elems;
  if (g.bytes == g.src_bytes) {
    std::memcpy(dst, src, static_cast<size_t>(nb * g.bytes));
    return;
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* s = src + b * g.src_bytes;
    uint8_t* d = dst + b * g.bytes;
    std::memcpy(d, s, static_cast<size_t>(g.pad_at));
    d[g.pad_at] = 0;
    d[g.pad_at + 1] = 0;
    std::memcpy(d + g.pad_at + 2, s + g.pad_at, static_cast<size_t>(g.src_bytes - g.pad_at));
  }
}

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K block (kernels/quant_blocks.h).
METRO_HD void scale_min_k4(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Element i of padded block `b`, exactly as dequantize_row_ref computes it.
METRO_HD float dequant_elem(DType t, const uint8_t* b, int i) {
  switch (t) {
    case DType::kF32: return load_f32(b);
    case DType::kF16: return load_fp16(b);
    case DType::kBF16: return bf16_to_f32(load_u16(b));
    case DType::kQ8_0: return mul_rn(static_cast<float>(static_cast<int8_t>(b[4 + i])), load_fp16(b));
    case DType::kQ4_0: {
      const int q = i < 16 ? (b[4 + i] & 0x0F) : (b[4 + i - 16] >> 4);
      return mul_rn(static_cast<float>(q - 8), load_fp16(b));
    }
    case DType::kQ4_1: {
      const int q = i < 16 ? (b[4 + i] & 0x0F) : (b[4 + i - 16] >> 4);
      return add_rn(mul_rn(load_fp16(b), static_cast<float>(q)), load_fp16(b + 2));
    }
    case DType::kQ5_0: {
      const uint32_t qh = load_u32(b + 4);
      int q = i < 16 ? (b[8 + i] & 0x0F) : (b[8 + i - 16] >> 4);
      q |= static_cast<int>((qh >> i) & 1u) << 4;
      return mul_rn(static_cast<float>(q - 16), load_fp16(b));
    }
    case DType::kQ5_1: {
      const uint32_t qh = load_u32(b + 4);
      int q = i < 16 ? (b[8 + i] & 0x0F) : (b[8 + i - 16] >> 4);
      q |= static_cast<int>((qh >> i) & 1u) << 4;
      return add_rn(mul_rn(load_fp16(b), static_cast<float>(q)), load_fp16(b + 2));
    }
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const int c = i / 64, hi = (i / 32) % 2, l = i % 32, j = 2 * c + hi;
      int sc, m;
      scale_min_k4(b + 4, j, &sc, &m);
      const bool q5 = t == DType::kQ5_K;
      const uint8_t byte = b[(q5 ? 48 : 16) + 32 * c + l];
      int q = hi ? byte >> 4 : byte & 0x0F;
      if (q5) q |= ((b[16 + l] >> j) & 1) << 4;
      const float d = mul_rn(load_fp16(b), static_cast<float>(sc));
      const float dm = mul_rn(load_fp16(b + 2), static_cast<float>(m));
      return sub_rn(mul_rn(d, static_cast<float>(q)), dm);
    }
    case DType::kQ6_K: {
      const int h = i / 128, tq = (i % 128) / 32, l = i % 32;
      const uint8_t lo = b[64 * h + l + (tq & 1) * 32];
      const int q = ((tq >= 2 ? lo >> 4 : lo & 0x0F) | (((b[128 + 32 * h + l] >> (2 * tq)) & 3) << 4)) - 32;
      const float ds = mul_rn(load_fp16(b + 208), static_cast<float>(static_cast<int8_t>(b[192 + i / 16])));
      return mul_rn(ds, static_cast<float>(q));
    }
    default: return 0.0f;
  }
}

// ---- quantized activations ------------------------------------------------------------

METRO_HD int act_block_bytes(DType partner) {
  switch (partner) {
    case DType::kQ8_0: return 36;
    case DType::kQ8_1: return 40;
    case DType::kQ8_K: return 292;
    default: return 0;
  }
}

METRO_HD int act_block_elems(DType partner) { return partner == DType::kQ8_K ? 256 : 32; }

METRO_HD int64_t act_row_bytes(DType partner, int64_t n) {
  return n / act_block_elems(partner) * act_block_bytes(partner);
}

// quant_sym8 of kernels/quant_ref.cpp over n values: q[i] = round-half-away(x * (1/d)),
// d = amax / 127; returns d.
METRO_HD float quant_sym8(const float* x, int n, int8_t* q) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = fmaxf(amax, fabsf(x[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < n; ++i) q[i] = round_away_i8(mul_rn(x[i], id));
  return d;
}

// One block of the partner's device format from `elems` floats of x.
METRO_HD void quantize_act_block(DType partner, const float* x, uint8_t* dst) {
  int8_t* qs = reinterpret_cast<int8_t*>(dst);
  if (partner == DType::kQ8_K) {
    const float d = quant_sym8(x, 256, qs);
    std::memcpy(dst + 256, &d, 4);
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += qs[16 * j + i];
      const int16_t s16 = static_cast<int16_t>(sum);
      std::memcpy(dst + 260 + 2 * j, &s16, 2);
    }
    return;
  }
  const float d = quant_sym8(x, 32, qs);
  const float dh = fp16_to_f32(f32_to_fp16(d));
  std::memcpy(dst + 32, &dh, 4);
  if (partner == DType::kQ8_1) {
    int sum = 0;
    for (int i = 0; i < 32; ++i) sum += qs[i];
    const float s = fp16_to_f32(f32_to_fp16(mul_rn(static_cast<float>(sum), d)));
    std::memcpy(dst + 36, &s, 4);
  }
}

// ---- block dot products ---------------------------------------------------------------
//
// w: one padded weight block; a: the partner block of the same elements. The integer sums
// are exact; the float terms are those of vec_dot_ref (kernels/vec_dot_ref.cpp), so a
// product's only difference from the reference is the float rounding of a few terms and of
// their combination.

// Sum over 8 words of int8 quants against the act block's words (4-aligned).
METRO_HD int dot32(const uint32_t w[8], const uint8_t* a, int acc) {
  for (int k = 0; k < 8; ++k) acc = dot4(w[k], load_u32(a + 4 * k), acc);
  return acc;
}

// The 32 quants (before offsets) of a 4/5-bit 32-block: nibbles at qs, fifth bits in qh.
METRO_HD void nibble_words(const uint8_t* qs, uint32_t w[8]) {
  for (int k = 0; k < 4; ++k) {
    const uint32_t x = load_u32(qs + 4 * k);
    w[k] = x & 0x0F0F0F0Fu;
    w[k + 4] = (x >> 4) & 0x0F0F0F0Fu;
  }
}

METRO_HD void add_fifth_bits(uint32_t qh, uint32_t w[8]) {
  for (int k = 0; k < 4; ++k) {
    w[k] |= spread4((qh >> (4 * k)) & 0xFu);
    w[k + 4] |= spread4((qh >> (16 + 4 * k)) & 0xFu);
  }
}

template <DType T>
METRO_HD float block_dot(const uint8_t* w, const uint8_t* a) {
  if constexpr (T == DType::kQ8_0 || T == DType::kQ4_0 || T == DType::kQ5_0) {
    uint32_t q[8];
    if constexpr (T == DType::kQ8_0) {
      for (int k = 0; k < 8; ++k) q[k] = load_u32(w + 4 + 4 * k);
    } else if constexpr (T == DType::kQ4_0) {
      nibble_words(w + 4, q);
      for (int k = 0; k < 8; ++k) q[k] = vsub4(q[k], 0x08080808u);
    } else {
      nibble_words(w + 8, q);
      add_fifth_bits(load_u32(w + 4), q);
      for (int k = 0; k < 8; ++k) q[k] = vsub4(q[k], 0x10101010u);
    }
    const int isum = dot32(q, a, 0);
    return load_fp16(w) * load_f32(a + 32) * static_cast<float>(isum);
  } else if constexpr (T == DType::kQ4_1 || T == DType::kQ5_1) {
    uint32_t q[8];
    if constexpr (T == DType::kQ4_1) {
      nibble_words(w + 4, q);
    } else {
      nibble_words(w + 8, q);
      add_fifth_bits(load_u32(w + 4), q);
    }
    const int isum = dot32(q, a, 0);
    return load_fp16(w) * load_f32(a + 32) * static_cast<float>(isum) + load_fp16(w + 2) * load_f32(a + 36);
  } else if constexpr (T == DType::kQ4_K || T == DType::kQ5_K) {
    const bool q5 = T == DType::kQ5_K;
    const uint8_t* qs = w + (q5 ? 48 : 16);
    int scaled = 0, mins = 0;
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      scale_min_k4(w + 4, j, &sc, &m);
      const int c = j / 2, shift = 4 * (j % 2);
      uint32_t q[8];
      for (int k = 0; k < 8; ++k) {
        q[k] = (load_u32(qs + 32 * c + 4 * k) >> shift) & 0x0F0F0F0Fu;
        if (q5) q[k] |= ((load_u32(w + 16 + 4 * k) >> j) & 0x01010101u) << 4;
      }
      scaled += sc * dot32(q, a + 32 * j, 0);
      int16_t b0, b1;
      std::memcpy(&b0, a + 260 + 4 * j, 2);
      std::memcpy(&b1, a + 262 + 4 * j, 2);
      mins += m * (static_cast<int>(b0) + static_cast<int>(b1));
    }
    const float da = load_f32(a + 256);
    return load_fp16(w) * da * static_cast<float>(scaled) - load_fp16(w + 2) * da * static_cast<float>(mins);
  } else if constexpr (T == DType::kQ6_K) {
    int scaled = 0;
    for (int j = 0; j < 8; ++j) {  // 32 elements: half h, quarter tq of it
      const int h = j / 4, tq = j % 4;
      const uint8_t* ql = w + 64 * h + (tq & 1) * 32;
      const uint8_t* qh = w + 128 + 32 * h;
      uint32_t q[8];
      for (int k = 0; k < 8; ++k) {
        const uint32_t lo = (load_u32(ql + 4 * k) >> (tq >= 2 ? 4 : 0)) & 0x0F0F0F0Fu;
        const uint32_t hi = ((load_u32(qh + 4 * k) >> (2 * tq)) & 0x03030303u) << 4;
        q[k] = vsub4(lo | hi, 0x20202020u);
      }
      int s0 = 0, s1 = 0;
      for (int k = 0; k < 4; ++k) s0 = dot4(q[k], load_u32(a + 32 * j + 4 * k), s0);
      for (int k = 4; k < 8; ++k) s1 = dot4(q[k], load_u32(a + 32 * j + 4 * k), s1);
      scaled += static_cast<int8_t>(w[192 + 2 * j]) * s0 + static_cast<int8_t>(w[193 + 2 * j]) * s1;
    }
    return load_fp16(w + 208) * load_f32(a + 256) * static_cast<float>(scaled);
  } else {
    static_assert(T == DType::kQ8_0, "block_dot: not a quantized weight type");
    return 0.0f;
  }
}

// ---- KV pages (the CPU's format: kernels/attention.h) -----------------------------------

// One Q8_0 block of 32 values at dst (34 bytes, GGUF layout; dst 2-aligned), bit-identical
// to quantize_row_ref.
METRO_HD void store_q8_0_block(const float* x, uint8_t* dst) {
  int8_t q[32];
  const uint16_t d = f32_to_fp16(quant_sym8(x, 32, q));
  dst[0] = static_cast<uint8_t>(d & 0xff);
  dst[1] = static_cast<uint8_t>(d >> 8);
  for (int i = 0; i < 32; ++i) dst[2 + i] = static_cast<uint8_t>(q[i]);
}

// kernels::detail::quantize_query_q8 for one block of 32 scaled query values: int8 q with
// round-half-even, d = amax / 127 (NaN when a value is not finite).
METRO_HD float quantize_query_block(const float* x, int8_t* q) {
  float amax = 0.0f;
  bool finite = true;
  for (int i = 0; i < 32; ++i) {
    finite = finite && (f32_bits(x[i]) & 0x7f800000u) != 0x7f800000u;
    amax = fmaxf(amax, fabsf(x[i]));
  }
  if (!finite) {
    for (int i = 0; i < 32; ++i) q[i] = 0;
    return bits_f32(0x7fc00000u);
  }
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int i = 0; i < 32; ++i) {
#if defined(__CUDA_ARCH__)
    const float r = rintf(mul_rn(x[i], inv));
#else
    const float r = std::nearbyint(mul_rn(x[i], inv));
#endif
    q[i] = static_cast<int8_t>(fminf(fmaxf(r, -127.0f), 127.0f));
  }
  return amax / 127.0f;
}

// A Q8_0 key row (hd / 32 blocks of 34 bytes, 2-aligned) scored against a query row that
// quantize_query_block rounded (qi 4-aligned, qd a scale per block): over the blocks in
// order, acc = fma(S_b, qd_b x kd_b, acc) from 0 with S_b the exact int8 dot product, which
// are the bits of kernels::detail::score_q8_ref.
METRO_HD float score_q8_row(const int8_t* qi, const float* qd, const uint8_t* krow, int hd) {
  const uint8_t* qb = reinterpret_cast<const uint8_t*>(qi);
  float dot = 0.0f;
  for (int b = 0; b < hd / 32; ++b) {
    const uint8_t* blk = krow + 34 * b;
    int isum = 0;
    for (int k = 0; k < 8; ++k) isum = dot4(load_u32(qb + 32 * b + 4 * k), load_u32_a2(blk + 2 + 4 * k), isum);
    dot = fma_rn(static_cast<float>(isum), mul_rn(qd[b], load_fp16(blk)), dot);
  }
  return dot;
}

}  // namespace metro::backends::cuda
