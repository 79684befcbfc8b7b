#include "kernels/repack.h"

#include <cstring>

#include "base/check.h"
#include "kernels/quant_blocks.h"

namespace metro::kernels {

namespace {

// Q5 fifth bits: row-major qh (bit e = element e) <-> transposed byte 4r + c, bit g.
void transpose_qh_in(const uint8_t qh_row[4], int r, uint8_t qh_x8[32]) {
  uint32_t bits;
  std::memcpy(&bits, qh_row, 4);
  for (int c = 0; c < 4; ++c) {
    uint8_t v = 0;
    for (int g = 0; g < 8; ++g) v = static_cast<uint8_t>(v | (((bits >> (4 * g + c)) & 1u) << g));
    qh_x8[4 * r + c] = v;
  }
}

void transpose_qh_out(const uint8_t qh_x8[32], int r, uint8_t qh_row[4]) {
  uint32_t bits = 0;
  for (int c = 0; c < 4; ++c) {
    for (int g = 0; g < 8; ++g) bits |= static_cast<uint32_t>((qh_x8[4 * r + c] >> g) & 1u) << (4 * g + c);
  }
  std::memcpy(qh_row, &bits, 4);
}

// `n_words` 4-byte words of row r <-> word t of row r at byte 32t + 4r of the group.
void interleave_words(const uint8_t* row, int n_words, int r, uint8_t* out) {
  for (int t = 0; t < n_words; ++t) std::memcpy(out + 32 * t + 4 * r, row + 4 * t, 4);
}

void deinterleave_words(const uint8_t* in, int n_words, int r, uint8_t* row) {
  for (int t = 0; t < n_words; ++t) std::memcpy(row + 4 * t, in + 32 * t + 4 * r, 4);
}

void interleave_qs16(const uint8_t qs[16], int r, uint8_t out[128]) { interleave_words(qs, 4, r, out); }
void deinterleave_qs16(const uint8_t in[128], int r, uint8_t qs[16]) { deinterleave_words(in, 4, r, qs); }

// Q4_K / Q5_K: row r's packed 6-bit scales and mins as bytes, sub-block j at 8j + r.
void unpack_k4_scales(const uint8_t packed[12], int r, uint8_t scales[64], uint8_t mins[64]) {
  for (int j = 0; j < 8; ++j) unpack_scale_min_k4(packed, j, &scales[8 * j + r], &mins[8 * j + r]);
}

void pack_k4_scales(const uint8_t scales[64], const uint8_t mins[64], int r, uint8_t packed[12]) {
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = scales[8 * j + r];
    m[j] = mins[8 * j + r];
  }
  pack_scale_min_k4(sc, m, packed);
}

// Fills one group block from block b of 8 rows (absent rows: zero blocks).
void pack_group(DType t, const uint8_t* const rows[8], int64_t b, uint8_t* out) {
  switch (t) {
    case DType::kQ4_0: {
      BlockQ4_0x8 g{};
      for (int r = 0; r < 8; ++r) {
        if (!rows[r]) continue;
        const auto s = load_block<BlockQ4_0>(rows[r], b);
        g.d[r] = s.d;
        interleave_qs16(s.qs, r, g.qs);
      }
      std::memcpy(out, &g, sizeof g);
      return;
    }
    case DType::kQ4_1: {
      BlockQ4_1x8 g{};
      for (int r = 0; r < 8; ++r) {
        if (!rows[r]) continue;
        const auto s = load_block<BlockQ4_1>(rows[r], b);
        g.d[r] = s.d;
        g.m[r] = s.m;
        interleave_qs16(s.qs, r, g.qs);
      }
      std::memcpy(out, &g, sizeof g);
      return;
    }
    case DType::kQ5_0: {
      BlockQ5_0x8 g{};
      for (int r = 0; r < 8; ++r) {
        if (!rows[r]) continue;
        const auto s = load_block<BlockQ5_0>(rows[r], b);
        g.d[r] = s.d;
        transpose_qh_in(s.qh, r, g.qh);
        interleave_qs16(s.qs, r, g.qs);
      }
      std::memcpy(out, &g, sizeof g);
      return;
    }
    case DType::kQ5_1: {
      BlockQ5_1x8 g{};
      for (int r = 0; r < 8; ++r) {
        if (!rows[r]) continue;
        const auto s = load_block<BlockQ5_1>(rows[r], b);
        g.d[r] = s.d;
        g.m[r] = s.m;
        transpose_qh_in(s.qh, r, g.qh);
        interleave_qs16(s.qs, r, g.qs);
      }
      std::memcpy(out, &g, sizeof g);
      return;
    }
    case DType::kQ8_0: {
      BlockQ8_0x8 g{};
      for (int r = 0; r < 8; ++r) {
        if (!rows[r]) continue;
        const auto s = load_block<BlockQ8_0>(rows[r], b);
        g.d[r] = s.d;
        interleave_words(reinterpret_cast<const uint8_t*>(s.qs), 8, r, reinterpret_cast<uint8_t*>(g.qs));
      }
      std::memcpy(out, &g, sizeof g);
      return;
    }
    case DType::kQ4_K: {
      BlockQ4_Kx8 g{};
      for (int r = 0; r < 8; ++r) {
        if (!rows[r]) continue;
        const auto s = load_block<BlockQ4_K>(rows[r], b);
        g.d[r] = s.d;
        g.dmin[r] = s.dmin;
        unpack_k4_scales(s.scales, r, g.scales, g.mins);
        interleave_words(s.qs, 32, r, g.qs);
      }
      std::memcpy(out, &g, sizeof g);
      return;
    }
    case DType::kQ5_K: {
      BlockQ5_Kx8 g{};
      for (int r = 0; r < 8; ++r) {
        if (!rows[r]) continue;
        const auto s = load_block<BlockQ5_K>(rows[r], b);
        g.d[r] = s.d;
        g.dmin[r] = s.dmin;
        unpack_k4_scales(s.scales, r, g.scales, g.mins);
        interleave_words(s.qh, 8, r, g.qh);
        interleave_words(s.qs, 32, r, g.qs);
      }
      std::memcpy(out, &g, sizeof g);
      return;
    }
    case DType::kQ6_K: {
      BlockQ6_Kx8 g{};
      for (int r = 0; r < 8; ++r) {
        if (!rows[r]) continue;
        const auto s = load_block<BlockQ6_K>(rows[r], b);
        g.d[r] = s.d;
        for (int j = 0; j < 16; ++j) g.scales[8 * j + r] = s.scales[j];
        interleave_words(s.ql, 32, r, g.ql);
        interleave_words(s.qh, 16, r, g.qh);
      }
      std::memcpy(out, &g, sizeof g);
      return;
    }
    case DType::kQ2_K: {
      BlockQ2_Kx8 g{};
      for (int r = 0; r < 8; ++r) {
        if (!rows[r]) continue;
        const auto s = load_block<BlockQ2_K>(rows[r], b);
        g.d[r] = s.d;
        g.dmin[r] = s.dmin;
        for (int j = 0; j < 16; ++j) g.scales[8 * j + r] = s.scales[j];
        interleave_words(s.qs, 16, r, g.qs);
      }
      std::memcpy(out, &g, sizeof g);
      return;
    }
    case DType::kQ3_K: {
      BlockQ3_Kx8 g{};
      for (int r = 0; r < 8; ++r) {
        if (!rows[r]) continue;
        const auto s = load_block<BlockQ3_K>(rows[r], b);
        g.d[r] = s.d;
        for (int j = 0; j < 16; ++j) g.scales[8 * j + r] = static_cast<int8_t>(q3_k_scale(s.scales, j));
        interleave_words(s.hmask, 8, r, g.hmask);
        interleave_words(s.qs, 16, r, g.qs);
      }
      std::memcpy(out, &g, sizeof g);
      return;
    }
    default: METRO_CHECK_MSG(false, "repack_x8: no x8 layout for this type");
  }
}

}  // namespace

bool has_x8_layout(DType t) {
  return t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ5_0 || t == DType::kQ5_1 ||
         t == DType::kQ8_0 || t == DType::kF16 || t == DType::kQ2_K || t == DType::kQ3_K ||
         t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K;
}

bool can_repack_x8(DType t, int64_t n_cols) {
  return has_x8_layout(t) && n_cols % (t == DType::kF16 ? 8 : traits(t).block_size) == 0;
}

size_t x8_block_bytes(DType t) {
  if (t == DType::kQ4_K) return sizeof(BlockQ4_Kx8);
  if (t == DType::kQ5_K) return sizeof(BlockQ5_Kx8);
  if (t == DType::kQ3_K) return sizeof(BlockQ3_Kx8);
  return static_cast<size_t>(kX8Rows * traits(t).bytes_per_block);
}

size_t x8_group_stride(DType t, int64_t n_cols) {
  if (t == DType::kF16) return kX8Rows * row_bytes(t, n_cols);
  return x8_block_bytes(t) * static_cast<size_t>(n_cols / traits(t).block_size);
}

size_t x8_bytes(DType t, int64_t n_rows, int64_t n_cols) {
  const auto groups = static_cast<size_t>((n_rows + kX8Rows - 1) / kX8Rows);
  return groups * x8_group_stride(t, n_cols);
}

void repack_x8(DType t, const uint8_t* src, size_t src_stride, int64_t n_rows, int64_t n_cols,
               uint8_t* dst) {
  METRO_CHECK(can_repack_x8(t, n_cols));
  if (t == DType::kF16) {
    // Element c of the group's 8 rows side by side: 16 bytes per column, one stream.
    for (int64_t r0 = 0; r0 < n_rows; r0 += kX8Rows) {
      uint16_t* group = reinterpret_cast<uint16_t*>(dst + static_cast<size_t>(r0 / kX8Rows) * x8_group_stride(t, n_cols));
      for (int r = 0; r < kX8Rows; ++r) {
        const uint8_t* row = r0 + r < n_rows ? src + static_cast<size_t>(r0 + r) * src_stride : nullptr;
        for (int64_t c = 0; c < n_cols; ++c) {
          uint16_t h = 0;
          if (row) std::memcpy(&h, row + 2 * c, 2);
          group[c * kX8Rows + r] = h;
        }
      }
    }
    return;
  }
  const int64_t nb = n_cols / traits(t).block_size;
  const size_t group_block = x8_block_bytes(t);
  for (int64_t r0 = 0; r0 < n_rows; r0 += kX8Rows) {
    const uint8_t* rows[8];
    for (int r = 0; r < 8; ++r) rows[r] = r0 + r < n_rows ? src + static_cast<size_t>(r0 + r) * src_stride : nullptr;
    uint8_t* group = dst + static_cast<size_t>(r0 / kX8Rows) * x8_group_stride(t, n_cols);
    for (int64_t b = 0; b < nb; ++b) pack_group(t, rows, b, group + static_cast<size_t>(b) * group_block);
  }
}

void unpack_x8_block(DType t, const uint8_t* group_block, uint8_t* blocks) {
  switch (t) {
    case DType::kF16:  // a block is one element: the 8 rows' elements are already in order
      std::memcpy(blocks, group_block, 2 * kX8Rows);
      return;
    case DType::kQ4_0: {
      const auto g = load_block<BlockQ4_0x8>(group_block, 0);
      for (int r = 0; r < 8; ++r) {
        BlockQ4_0 s;
        s.d = g.d[r];
        deinterleave_qs16(g.qs, r, s.qs);
        store_block(blocks, r, s);
      }
      return;
    }
    case DType::kQ4_1: {
      const auto g = load_block<BlockQ4_1x8>(group_block, 0);
      for (int r = 0; r < 8; ++r) {
        BlockQ4_1 s;
        s.d = g.d[r];
        s.m = g.m[r];
        deinterleave_qs16(g.qs, r, s.qs);
        store_block(blocks, r, s);
      }
      return;
    }
    case DType::kQ5_0: {
      const auto g = load_block<BlockQ5_0x8>(group_block, 0);
      for (int r = 0; r < 8; ++r) {
        BlockQ5_0 s;
        s.d = g.d[r];
        transpose_qh_out(g.qh, r, s.qh);
        deinterleave_qs16(g.qs, r, s.qs);
        store_block(blocks, r, s);
      }
      return;
    }
    case DType::kQ5_1: {
      const auto g = load_block<BlockQ5_1x8>(group_block, 0);
      for (int r = 0; r < 8; ++r) {
        BlockQ5_1 s;
        s.d = g.d[r];
        s.m = g.m[r];
        transpose_qh_out(g.qh, r, s.qh);
        deinterleave_qs16(g.qs, r, s.qs);
        store_block(blocks, r, s);
      }
      return;
    }
    case DType::kQ8_0: {
      const auto g = load_block<BlockQ8_0x8>(group_block, 0);
      for (int r = 0; r < 8; ++r) {
        BlockQ8_0 s;
        s.d = g.d[r];
        deinterleave_words(reinterpret_cast<const uint8_t*>(g.qs), 8, r, reinterpret_cast<uint8_t*>(s.qs));
        store_block(blocks, r, s);
      }
      return;
    }
    case DType::kQ4_K: {
      const auto g = load_block<BlockQ4_Kx8>(group_block, 0);
      for (int r = 0; r < 8; ++r) {
        BlockQ4_K s;
        s.d = g.d[r];
        s.dmin = g.dmin[r];
        pack_k4_scales(g.scales, g.mins, r, s.scales);
        deinterleave_words(g.qs, 32, r, s.qs);
        store_block(blocks, r, s);
      }
      return;
    }
    case DType::kQ5_K: {
      const auto g = load_block<BlockQ5_Kx8>(group_block, 0);
      for (int r = 0; r < 8; ++r) {
        BlockQ5_K s;
        s.d = g.d[r];
        s.dmin = g.dmin[r];
        pack_k4_scales(g.scales, g.mins, r, s.scales);
        deinterleave_words(g.qh, 8, r, s.qh);
        deinterleave_words(g.qs, 32, r, s.qs);
        store_block(blocks, r, s);
      }
      return;
    }
    case DType::kQ6_K: {
      const auto g = load_block<BlockQ6_Kx8>(group_block, 0);
      for (int r = 0; r < 8; ++r) {
        BlockQ6_K s;
        s.d = g.d[r];
        for (int j = 0; j < 16; ++j) s.scales[j] = g.scales[8 * j + r];
        deinterleave_words(g.ql, 32, r, s.ql);
        deinterleave_words(g.qh, 16, r, s.qh);
        store_block(blocks, r, s);
      }
      return;
    }
    case DType::kQ2_K: {
      const auto g = load_block<BlockQ2_Kx8>(group_block, 0);
      for (int r = 0; r < 8; ++r) {
        BlockQ2_K s;
        s.d = g.d[r];
        s.dmin = g.dmin[r];
        for (int j = 0; j < 16; ++j) s.scales[j] = g.scales[8 * j + r];
        deinterleave_words(g.qs, 16, r, s.qs);
        store_block(blocks, r, s);
      }
      return;
    }
    case DType::kQ3_K: {
      const auto g = load_block<BlockQ3_Kx8>(group_block, 0);
      for (int r = 0; r < 8; ++r) {
        BlockQ3_K s;
        s.d = g.d[r];
        int sc[16];
        for (int j = 0; j < 16; ++j) sc[j] = g.scales[8 * j + r];
        pack_q3_k_scales(sc, s.scales);
        deinterleave_words(g.hmask, 8, r, s.hmask);
        deinterleave_words(g.qs, 16, r, s.qs);
        store_block(blocks, r, s);
      }
      return;
    }
    default: METRO_CHECK_MSG(false, "unpack_x8_block: no x8 layout for this type");
  }
}

}  // namespace metro::kernels
