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

inline void pack_scale_min_k4(const uint8_t sc[8], const uint8_t m[8], uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4));
  }
}

}  // namespace metro::kernels
