// The x8-interleaved weight layout (internal to kernels/).
//
// F16: column c of 8 rows is 8 halves side by side (16 bytes), columns in order, so a GEMV
// streams one contiguous run per group instead of 8 short rows (rows of 576 halves are too
// short for the hardware prefetcher to follow 8 of them at once).
//
// Rows are taken 8 at a time; block b of the 8 rows becomes one group block holding the 8
// scales side by side and the quants interleaved 4 bytes per row, so that one 32-byte
// load gives bytes 4t..4t+3 of every row: each 32-bit SIMD lane then belongs to one
// weight row, an act's 4 bytes broadcast to all lanes multiply 8 rows at once, and the
// 8 scales convert with one instruction. Rows past n_rows in the last group are zero.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"

namespace metro::kernels {

// Lane r, byte c of the 32-byte word t is byte 4t + c of row r's qs.
struct BlockQ4_0x8 {
  uint16_t d[8];
  uint8_t qs[128];
};

struct BlockQ4_1x8 {
  uint16_t d[8];
  uint16_t m[8];
  uint8_t qs[128];
};

// qh is transposed so the fifth bits unpack with shifts: bit g of byte 4r + c is the
// fifth bit of element 4g + c of row r.
struct BlockQ5_0x8 {
  uint16_t d[8];
  uint8_t qh[32];
  uint8_t qs[128];
};

struct BlockQ5_1x8 {
  uint16_t d[8];
  uint16_t m[8];
  uint8_t qh[32];
  uint8_t qs[128];
};

struct BlockQ8_0x8 {
  uint16_t d[8];
  int8_t qs[256];
};

// Q4_K: one 256-element super-block of 8 rows. The sub-block scales and mins leave their
// 6-bit packing as bytes (scales[8 * j + r]: sub-block j of row r), so that 8 bytes give
// one sub-block's scale in every lane; word w of the 32 in qs holds bytes 4w..4w+3 of each
// row's qs (so chunk c's 32 bytes are words 8c..8c+7: low nibbles sub-block 2c, high
// nibbles sub-block 2c + 1, as in BlockQ4_K). 1184 bytes for 8 x 144.
struct BlockQ4_Kx8 {
  uint16_t d[8];
  uint16_t dmin[8];
  uint8_t scales[64];
  uint8_t mins[64];
  uint8_t qs[1024];
};

// Q5_K: Q4_K's group plus the fifth bits, qh word t (of 8) holding bytes 4t..4t+3 of each
// row's qh (bit h of a byte: the fifth bit of that element of sub-block h). 1440 bytes.
struct BlockQ5_Kx8 {
  uint16_t d[8];
  uint16_t dmin[8];
  uint8_t scales[64];
  uint8_t mins[64];
  uint8_t qh[256];
  uint8_t qs[1024];
};

// Q6_K: scales[8 * j + r] is sub-block j (of 16) of row r; ql word w (of 32) and qh word w
// (of 16) hold bytes 4w..4w+3 of each row's ql and qh, as the 4-bit formats interleave qs.
// 1680 bytes, the same as 8 x 210.
struct BlockQ6_Kx8 {
  uint16_t d[8];
  int8_t scales[128];
  uint8_t ql[1024];
  uint8_t qh[512];
};

// Q2_K: scales[8 * j + r] is row r's GGUF byte of sub-block j (of 16: scale in the low
// nibble, min in the high one); qs word w (of 16) holds bytes 4w..4w+3 of each row's qs.
// 672 bytes, the same as 8 x 84.
struct BlockQ2_Kx8 {
  uint16_t d[8];
  uint16_t dmin[8];
  uint8_t scales[128];
  uint8_t qs[512];
};

// Q3_K: scales[8 * j + r] is sub-block j's signed scale (sc - 32) of row r, unpacked from
// its 6 bits; hmask word t (of 8) and qs word w (of 16) hold bytes 4t..4t+3 (4w..4w+3) of
// each row's hmask and qs. 912 bytes for 8 x 110.
struct BlockQ3_Kx8 {
  uint16_t d[8];
  int8_t scales[128];
  uint8_t hmask[256];
  uint8_t qs[512];
};

static_assert(sizeof(BlockQ2_Kx8) == 8 * 84 && sizeof(BlockQ3_Kx8) == 912);
static_assert(sizeof(BlockQ4_0x8) == 8 * 18 && sizeof(BlockQ4_1x8) == 8 * 20);
static_assert(sizeof(BlockQ6_Kx8) == 8 * 210);
static_assert(sizeof(BlockQ4_Kx8) == 1184 && sizeof(BlockQ5_Kx8) == 1440);
static_assert(sizeof(BlockQ5_0x8) == 8 * 22 && sizeof(BlockQ5_1x8) == 8 * 24);
static_assert(sizeof(BlockQ8_0x8) == 8 * 34);

inline constexpr int kX8Rows = 8;

bool has_x8_layout(DType t);
// Whether a matrix of this width can be repacked (whole blocks; F16: columns in 8s).
bool can_repack_x8(DType t, int64_t n_cols);
// Bytes of one group block (8 rows' blocks b, repacked).
size_t x8_block_bytes(DType t);
// Bytes between consecutive 8-row groups, and of the whole repacked matrix.
size_t x8_group_stride(DType t, int64_t n_cols);
size_t x8_bytes(DType t, int64_t n_rows, int64_t n_cols);

// src: n_rows row-major rows of n_cols, src_stride bytes apart; dst: x8_bytes(...) bytes.
void repack_x8(DType t, const uint8_t* src, size_t src_stride, int64_t n_rows, int64_t n_cols,
               uint8_t* dst);

// The inverse for one group block: writes the 8 rows' blocks, GGUF layout, back to back.
void unpack_x8_block(DType t, const uint8_t* group_block, uint8_t* blocks);

}  // namespace metro::kernels
