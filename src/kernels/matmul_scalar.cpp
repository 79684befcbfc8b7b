// Portable kernels: the fallback on CPUs without AVX2, in plain C++.
//
// Per output element: for the block formats, acc += float(isum) * (dw * da), plus
// mw * s for the formats with a min, block after block; for the float formats a plain
// running sum. The x8 kernels unpack each group block to row-major blocks and do the same.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "base/fp16.h"
#include "kernels/kernel_table.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_ref_formats.h"
#include "kernels/repack.h"

namespace metro::kernels {

namespace {

float h2f(uint16_t h) { return fp16_to_fp32(h); }

int isum_q4(const uint8_t qs[16], const int8_t* a, int offset) {
  int s = 0;
  for (int i = 0; i < 16; ++i) {
    s += ((qs[i] & 0x0F) - offset) * a[i];
    s += ((qs[i] >> 4) - offset) * a[i + 16];
  }
  return s;
}

int isum_q5(const uint8_t qs[16], const uint8_t qh_bytes[4], const int8_t* a, int offset) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  int s = 0;
  for (int i = 0; i < 16; ++i) {
    const int lo = (qs[i] & 0x0F) | static_cast<int>(((qh >> i) & 1u) << 4);
    const int hi = (qs[i] >> 4) | static_cast<int>(((qh >> (i + 16)) & 1u) << 4);
    s += (lo - offset) * a[i] + (hi - offset) * a[i + 16];
  }
  return s;
}

float step(const BlockQ4_0& w, const BlockQ8_0& a, float acc) {
  return acc + static_cast<float>(isum_q4(w.qs, a.qs, 8)) * (h2f(w.d) * h2f(a.d));
}
float step(const BlockQ5_0& w, const BlockQ8_0& a, float acc) {
  return acc + static_cast<float>(isum_q5(w.qs, w.qh, a.qs, 16)) * (h2f(w.d) * h2f(a.d));
}
float step(const BlockQ4_1& w, const BlockQ8_1& a, float acc) {
  acc += static_cast<float>(isum_q4(w.qs, a.qs, 0)) * (h2f(w.d) * h2f(a.d));
  return acc + h2f(w.m) * h2f(a.s);
}
float step(const BlockQ5_1& w, const BlockQ8_1& a, float acc) {
  acc += static_cast<float>(isum_q5(w.qs, w.qh, a.qs, 0)) * (h2f(w.d) * h2f(a.d));
  return acc + h2f(w.m) * h2f(a.s);
}
float step(const BlockQ8_0& w, const BlockQ8_0& a, float acc) {
  int s = 0;
  for (int i = 0; i < 32; ++i) s += w.qs[i] * a.qs[i];
  return acc + static_cast<float>(s) * (h2f(w.d) * h2f(a.d));
}

template <class WB>
float step_k_affine(const WB& w, const BlockQ8_K& a, float acc) {
  int scaled = 0, mins = 0;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    unpack_scale_min_k4(w.scales, j, &sc, &m);
    int s = 0;
    for (int l = 0; l < 32; ++l) {
      const uint8_t byte = w.qs[32 * (j / 2) + l];
      int q = (j % 2) ? byte >> 4 : byte & 0x0F;
      if constexpr (std::is_same_v<WB, BlockQ5_K>) q |= ((w.qh[l] >> j) & 1) << 4;
      s += q * a.qs[32 * j + l];
    }
    scaled += sc * s;
    mins += m * (a.bsums[2 * j] + a.bsums[2 * j + 1]);
  }
  acc += static_cast<float>(scaled) * (h2f(w.d) * a.d);
  return acc - static_cast<float>(mins) * (h2f(w.dmin) * a.d);
}
float step(const BlockQ4_K& w, const BlockQ8_K& a, float acc) { return step_k_affine(w, a, acc); }
float step(const BlockQ5_K& w, const BlockQ8_K& a, float acc) { return step_k_affine(w, a, acc); }

float step(const BlockQ6_K& w, const BlockQ8_K& a, float acc) {
  int scaled = 0;
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t lo = w.ql[64 * h + l], lo2 = w.ql[64 * h + l + 32], hi = w.qh[32 * h + l];
      const int q[4] = {((lo & 0x0F) | ((hi & 3) << 4)) - 32, ((lo2 & 0x0F) | (((hi >> 2) & 3) << 4)) - 32,
                        ((lo >> 4) | (((hi >> 4) & 3) << 4)) - 32, ((lo2 >> 4) | (((hi >> 6) & 3) << 4)) - 32};
      for (int t = 0; t < 4; ++t) {
        const int e = 128 * h + 32 * t + l;
        scaled += w.scales[e / 16] * q[t] * a.qs[e];
      }
    }
  }
  return acc + static_cast<float>(scaled) * (h2f(w.d) * a.d);
}

float step(const BlockQ2_K& w, const BlockQ8_K& a, float acc) {
  int scaled = 0, mins = 0;
  for (int j = 0; j < 16; ++j) {
    int s = 0;
    for (int i = 0; i < 16; ++i) s += q2_k_value(w.qs, 16 * j + i) * a.qs[16 * j + i];
    scaled += (w.scales[j] & 0x0F) * s;
    mins += (w.scales[j] >> 4) * a.bsums[j];
  }
  acc += static_cast<float>(scaled) * (h2f(w.d) * a.d);
  return acc - static_cast<float>(mins) * (h2f(w.dmin) * a.d);
}

float step(const BlockQ3_K& w, const BlockQ8_K& a, float acc) {
  int scaled = 0;
  for (int j = 0; j < 16; ++j) {
    int s = 0;
    for (int i = 0; i < 16; ++i) s += (q3_k_value(w.hmask, w.qs, 16 * j + i) - 4) * a.qs[16 * j + i];
    scaled += q3_k_scale(w.scales, j) * s;
  }
  return acc + static_cast<float>(scaled) * (h2f(w.d) * a.d);
}

template <class WB, class AB>
void tile_row_major(const MatmulTile& t) {
  const int64_t nb = t.k / static_cast<int64_t>(std::is_same_v<AB, BlockQ8_K> ? kQKK : kQK);
  for (int64_t i = 0; i < t.n_acts; ++i) {
    const uint8_t* a = t.a + i * t.a_stride;
    for (int64_t j = 0; j < t.n_rows; ++j) {
      const uint8_t* w = t.w + j * t.w_stride;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) acc = step(load_block<WB>(w, b), load_block<AB>(a, b), acc);
      t.y[i * t.y_stride + j] = acc;
    }
  }
}

template <class WB, class AB, DType kType>
void tile_x8(const MatmulTile& t) {
  const int64_t nb = t.k / kQK;
  for (int64_t g = 0; g * kX8Rows < t.n_rows; ++g) {
    const uint8_t* group = t.w + g * t.w_stride;
    const int rows = static_cast<int>(std::min<int64_t>(kX8Rows, t.n_rows - g * kX8Rows));
    for (int64_t i = 0; i < t.n_acts; ++i) {
      const uint8_t* a = t.a + i * t.a_stride;
      float acc[8] = {};
      for (int64_t b = 0; b < nb; ++b) {
        WB blocks[8];
        unpack_x8_block(kType, group + b * static_cast<int64_t>(sizeof(WB) * 8), reinterpret_cast<uint8_t*>(blocks));
        const auto ab = load_block<AB>(a, b);
        for (int r = 0; r < rows; ++r) acc[r] = step(blocks[r], ab, acc[r]);
      }
      for (int r = 0; r < rows; ++r) t.y[i * t.y_stride + g * kX8Rows + r] = acc[r];
    }
  }
}

template <DType kType>
void tile_float(const MatmulTile& t) {
  float buf[256];
  for (int64_t j = 0; j < t.n_rows; ++j) {
    for (int64_t i = 0; i < t.n_acts; ++i) {
      const auto* x = reinterpret_cast<const float*>(t.a + i * t.a_stride);
      float acc = 0.0f;
      for (int64_t c0 = 0; c0 < t.k; c0 += 256) {
        const int64_t len = std::min<int64_t>(256, t.k - c0);
        // Decoding a few elements at a time keeps the scalar path exact and simple.
        const uint8_t* w = t.w + j * t.w_stride + row_bytes(kType, c0);
        if constexpr (kType == DType::kF32) {
          std::memcpy(buf, w, static_cast<size_t>(len) * 4);
        } else {
          for (int64_t c = 0; c < len; ++c) {
            uint16_t h;
            std::memcpy(&h, w + 2 * c, 2);
            buf[c] = kType == DType::kF16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
          }
        }
        for (int64_t c = 0; c < len; ++c) acc += buf[c] * x[c0 + c];
      }
      t.y[i * t.y_stride + j] = acc;
    }
  }
}

void quantize_f32(const float* x, void* dst, int64_t k, const ActSide&) {
  std::memcpy(dst, x, static_cast<size_t>(k) * 4);
}

void quantize_q8_0(const float* x, void* dst, int64_t k, const ActSide& side) {
  quant_q8_0_ref(x, dst, k);
  for (int64_t b = 0; b < k / kQK; ++b) {
    const auto blk = load_block<BlockQ8_0>(dst, b);
    int32_t sum = 0;
    for (int8_t v : blk.qs) sum += v;
    if (side.d) side.d[b] = h2f(blk.d);
    if (side.sums) side.sums[b] = sum;
  }
}

void quantize_q8_1(const float* x, void* dst, int64_t k, const ActSide& side) {
  quant_q8_1_ref(x, dst, k);
  for (int64_t b = 0; b < k / kQK; ++b) {
    const auto blk = load_block<BlockQ8_1>(dst, b);
    if (side.d) side.d[b] = h2f(blk.d);
    if (side.s) side.s[b] = h2f(blk.s);
  }
}

void quantize_q8_k(const float* x, void* dst, int64_t k, const ActSide&) { quant_q8_k_ref(x, dst, k); }

constexpr KernelTable make_scalar_table() {
  KernelTable t;
  t.isa = "scalar";
  auto idx = [](DType d) { return static_cast<int>(d); };
  t.quantize_row[idx(DType::kF32)] = quantize_f32;
  t.quantize_row[idx(DType::kQ8_0)] = quantize_q8_0;
  t.quantize_row[idx(DType::kQ8_1)] = quantize_q8_1;
  t.quantize_row[idx(DType::kQ8_K)] = quantize_q8_k;
  t.tile_row_major[idx(DType::kF32)] = tile_float<DType::kF32>;
  t.tile_row_major[idx(DType::kF16)] = tile_float<DType::kF16>;
  t.tile_row_major[idx(DType::kBF16)] = tile_float<DType::kBF16>;
  t.tile_row_major[idx(DType::kQ4_0)] = tile_row_major<BlockQ4_0, BlockQ8_0>;
  t.tile_row_major[idx(DType::kQ4_1)] = tile_row_major<BlockQ4_1, BlockQ8_1>;
  t.tile_row_major[idx(DType::kQ5_0)] = tile_row_major<BlockQ5_0, BlockQ8_0>;
  t.tile_row_major[idx(DType::kQ5_1)] = tile_row_major<BlockQ5_1, BlockQ8_1>;
  t.tile_row_major[idx(DType::kQ8_0)] = tile_row_major<BlockQ8_0, BlockQ8_0>;
  t.tile_row_major[idx(DType::kQ4_K)] = tile_row_major<BlockQ4_K, BlockQ8_K>;
  t.tile_row_major[idx(DType::kQ5_K)] = tile_row_major<BlockQ5_K, BlockQ8_K>;
  t.tile_row_major[idx(DType::kQ6_K)] = tile_row_major<BlockQ6_K, BlockQ8_K>;
  t.tile_row_major[idx(DType::kQ2_K)] = tile_row_major<BlockQ2_K, BlockQ8_K>;
  t.tile_row_major[idx(DType::kQ3_K)] = tile_row_major<BlockQ3_K, BlockQ8_K>;
  t.tile_x8[idx(DType::kQ4_0)] = tile_x8<BlockQ4_0, BlockQ8_0, DType::kQ4_0>;
  t.tile_x8[idx(DType::kQ4_1)] = tile_x8<BlockQ4_1, BlockQ8_1, DType::kQ4_1>;
  t.tile_x8[idx(DType::kQ5_0)] = tile_x8<BlockQ5_0, BlockQ8_0, DType::kQ5_0>;
  t.tile_x8[idx(DType::kQ5_1)] = tile_x8<BlockQ5_1, BlockQ8_1, DType::kQ5_1>;
  t.tile_x8[idx(DType::kQ8_0)] = tile_x8<BlockQ8_0, BlockQ8_0, DType::kQ8_0>;
  return t;
}

constexpr KernelTable kScalarTable = make_scalar_table();

}  // namespace

const KernelTable& scalar_kernels() { return kScalarTable; }

}  // namespace metro::kernels
