// The GGUF/ggml block layouts, as C++ structs (internal to kernels/).
//
// Scales stored as `uint16_t` are IEEE binary16. Every struct is exactly the size GGUF
// gives the block, so a row of n elements is n / block_size structs laid end to end.
// Rows from a file are only 2-byte aligned (4 for Q8_K), so code reads blocks with
// memcpy or unaligned SIMD loads, never through a cast pointer.
#pragma once

#include <cstdint>
#include <cstring>

namespace metro::kernels {

inline constexpr int kQK = 32;    // elements per block of the 32-block formats
inline constexpr int kQKK = 256;  // elements per super-block of the K-quants

// x[i] = d * (q[i] - 8); q[i] is the low nibble of qs[i] for i < 16, the high nibble of
// qs[i - 16] for i >= 16.
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};

// x[i] = d * q[i] + m; nibbles as in Q4_0.
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};

// x[i] = d * (q[i] - 16); the low 4 bits as in Q4_0, bit 4 of q[i] is bit i of qh (LE u32).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};

// x[i] = d * q[i] + m; bits as in Q5_0.
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};

// x[i] = d * q[i].
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};

// x[i] = d * q[i]; s = d * sum(q) (rounded to f16), the term a Q4_1/Q5_1 min multiplies.
struct BlockQ8_1 {
  uint16_t d;
  uint16_t s;
  int8_t qs[32];
};

// 16 sub-blocks of 16: x = d * (scales[j] & 15) * q - dmin * (scales[j] >> 4), q in 0..3.
// Two halves of 128 elements; element 128h + 32s + l (s < 4, l < 32) is bits 2s..2s+1 of
// qs[32h + l] (q2_k_value).
struct BlockQ2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d;
  uint16_t dmin;
};

// 16 sub-blocks of 16: x = d * (sc[j] - 32) * (q - 4), q in 0..7. The low 2 bits of q sit
// in qs as Q2_K's do; bit 2 of element 128h + 32s + l is bit 4h + s of hmask[l]. The 6-bit
// sc[j] are packed in `scales` (q3_k_scale).
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};

// 8 sub-blocks of 32: x = d * sc[j] * q - dmin * m[j], q in 0..15. The 6-bit sc/m pairs
// are packed in `scales` (see unpack_scale_min_k4). qs holds 4 chunks of 64 elements,
// 32 bytes each: low nibbles are sub-block 2c, high nibbles sub-block 2c + 1.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};

// Q4_K plus a fifth bit: for chunk c, bit 2c of qh[l] is the high bit of element l of
// sub-block 2c, bit 2c + 1 that of element l of sub-block 2c + 1.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};

// 16 sub-blocks of 16: x = d * scales[j] * (q - 32), q in 0..63. Two halves of 128
// elements; in half h, for l < 32: element l takes the low nibble of ql[64h + l] and
// bits 0-1 of qh[32h + l]; element l + 32 the low nibble of ql[64h + l + 32] and bits 2-3;
// element l + 64 the high nibble of ql[64h + l] and bits 4-5; element l + 96 the high
// nibble of ql[64h + l + 32] and bits 6-7.
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};

// x[i] = d * q[i]; bsums[j] = sum of q over elements 16j .. 16j + 15.
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);

template <class Block>
inline Block load_block(const void* row, int64_t i) {
  Block b;
  std::memcpy(&b, static_cast<const uint8_t*>(row) + i * static_cast<int64_t>(sizeof(Block)),
              sizeof(Block));
  return b;
}

template <class Block>
inline void store_block(void* row, int64_t i, const Block& b) {
  std::memcpy(static_cast<uint8_t*>(row) + i * static_cast<int64_t>(sizeof(Block)), &b,
              sizeof(Block));
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block: sub-blocks 0-3
// keep theirs in the low 6 bits of bytes j and j + 4; sub-blocks 4-7 keep the low 4 bits
// in byte j + 4 (scale low nibble, min high nibble) and the top 2 bits in the top bits of
// bytes j - 4 (scale) and j (min).
inline void unpack_scale_min_k4(const uint8_t* s, int j, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// The 2-bit field of element e (0..255) of a Q2_K/Q3_K qs array.
inline int q2_k_value(const uint8_t* qs, int e) {
  const int h = e / 128, s = (e % 128) / 32, l = e % 32;
  return (qs[32 * h + l] >> (2 * s)) & 3;
}
inline void set_q2_k_value(uint8_t* qs, int e, int q) {
  const int h = e / 128, s = (e % 128) / 32, l = e % 32;
  qs[32 * h + l] = static_cast<uint8_t>((qs[32 * h + l] & ~(3 << (2 * s))) | ((q & 3) << (2 * s)));
}
// q (0..7) of element e of a Q3_K block.
inline int q3_k_value(const uint8_t* hmask, const uint8_t* qs, int e) {
  const int h = e / 128, s = (e % 128) / 32, l = e % 32;
  return q2_k_value(qs, e) | (((hmask[l] >> (4 * h + s)) & 1) << 2);
}
inline void set_q3_k_value(uint8_t* hmask, uint8_t* qs, int e, int q) {
  const int h = e / 128, s = (e % 128) / 32, l = e % 32;
  set_q2_k_value(qs, e, q & 3);
  const int bit = 4 * h + s;
  hmask[l] = static_cast<uint8_t>((hmask[l] & ~(1 << bit)) | (((q >> 2) & 1) << bit));
}
// The signed scale sc[j] - 32 (-32..31) of sub-block j (0..15) of a Q3_K block: the low 4
// bits are the low nibble of byte j (j < 8) or the high nibble of byte j - 8; the top 2
// bits are bits 2 * (j / 4) of byte 8 + j % 4.
inline int q3_k_scale(const uint8_t* s, int j) {
  const int lo = j < 8 ? s[j] & 0x0F : s[j - 8] >> 4;
  const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}
inline void pack_q3_k_scales(const int sc[16], uint8_t* s) {
  for (int i = 0; i < 12; ++i) s[i] = 0;
  for (int j = 0; j < 16; ++j) {
    const int v = sc[j] + 32;  // 0..63
    if (j < 8) {
      s[j] = static_cast<uint8_t>(s[j] | (v & 0x0F));
    } else {
      s[j - 8] = static_cast<uint8_t>(s[j - 8] | ((v & 0x0F) << 4));
    }
    s[8 + j % 4] = static_cast<uint8_t>(s[8 + j % 4] | (((v >> 4) & 3) << (2 * (j / 4))));
  }
}

inline void pack_scale_min_k4(const uint8_t sc[8], const uint8_t m[8], uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4));
  }
}

}  // namespace metro::kernels
