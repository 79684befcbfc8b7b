// AVX2 kernels for float weights (F32, F16, BF16) times F32 activations, row-major.
//
// Per output element: 8 lane sums over k in steps of 8, each lane a chain of FMAs in
// order of k, then hsum_ps (a fixed tree), then the k % 8 tail as a chain of scalar FMAs
// added last. Register tiles of kRows weight rows x kActs act rows only interleave such
// chains, so results do not depend on the tile, the thread split or m.
#include <algorithm>
#include <cstring>

#include "kernels/kernels_avx2.h"
#include "kernels/simd_avx2.h"

namespace metro::kernels::avx2 {

namespace {

struct F32Conv {
  static constexpr size_t kBytes = 4;
  static __m256 load8(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static float load1(const uint8_t* p) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
};

struct F16Conv {
  static constexpr size_t kBytes = 2;
  static __m256 load8(const uint8_t* p) { return load_f16x8(p); }
  static float load1(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return f16(h);
  }
};

struct BF16Conv {
  static constexpr size_t kBytes = 2;
  static __m256 load8(const uint8_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(p)), 16));
  }
  static float load1(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
  }
};

// kRows weight rows (w[r]) times kActs act rows (x[i]); y[i][r] for r < rows, i < acts.
template <class C, int kRows, int kActs>
void micro(const uint8_t* const w[kRows], const float* const x[kActs], int64_t k, float* y, size_t y_stride,
           int rows, int acts) {
  __m256 acc[kActs][kRows];
  for (int i = 0; i < kActs; ++i) {
    for (int r = 0; r < kRows; ++r) acc[i][r] = _mm256_setzero_ps();
  }
  const int64_t k8 = k / 8 * 8;
  for (int64_t c = 0; c < k8; c += 8) {
    __m256 wv[kRows];
    for (int r = 0; r < kRows; ++r) wv[r] = C::load8(w[r] + static_cast<size_t>(c) * C::kBytes);
    for (int i = 0; i < kActs; ++i) {
      const __m256 xv = _mm256_loadu_ps(x[i] + c);
      for (int r = 0; r < kRows; ++r) acc[i][r] = _mm256_fmadd_ps(wv[r], xv, acc[i][r]);
    }
  }
  for (int i = 0; i < acts; ++i) {
    for (int r = 0; r < rows; ++r) {
      __m128 tail = _mm_setzero_ps();
      for (int64_t c = k8; c < k; ++c) {
        tail = _mm_fmadd_ss(_mm_set_ss(C::load1(w[r] + static_cast<size_t>(c) * C::kBytes)), _mm_set_ss(x[i][c]), tail);
      }
      y[static_cast<size_t>(i) * y_stride + static_cast<size_t>(r)] = hsum_ps(acc[i][r]) + _mm_cvtss_f32(tail);
    }
  }
}

// Weight rows in blocks that stay in L2 (~128 KiB); within a block, acts outer and rows
// inner, so kActs act rows stay in L1 while the block's weight rows stream from L2.
template <class C, int kRows, int kActs>
void tile_loop(const MatmulTile& t) {
  const int64_t row_bytes = std::max<int64_t>(1, t.k * static_cast<int64_t>(C::kBytes));
  const int64_t block_rows = std::max<int64_t>(kRows, (128 << 10) / row_bytes / kRows * kRows);
  for (int64_t r0 = 0; r0 < t.n_rows; r0 += block_rows) {
    const int64_t r1 = std::min(t.n_rows, r0 + block_rows);
    for (int64_t i0 = 0; i0 < t.n_acts; i0 += kActs) {
      const int acts = static_cast<int>(std::min<int64_t>(kActs, t.n_acts - i0));
      const float* x[kActs];
      for (int i = 0; i < kActs; ++i) {
        x[i] = reinterpret_cast<const float*>(t.a + static_cast<size_t>(i0 + std::min(i, acts - 1)) * t.a_stride);
      }
      for (int64_t j0 = r0; j0 < r1; j0 += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, r1 - j0));
        const uint8_t* w[kRows];
        for (int r = 0; r < kRows; ++r) w[r] = t.w + static_cast<size_t>(j0 + std::min(r, rows - 1)) * t.w_stride;
        micro<C, kRows, kActs>(w, x, t.k, t.y + static_cast<size_t>(i0) * t.y_stride + static_cast<size_t>(j0),
                               t.y_stride, rows, acts);
      }
    }
  }
}

template <class C>
void tile_float(const MatmulTile& t) {
  if (t.n_acts == 1) {
    tile_loop<C, 8, 1>(t);  // GEMV: 8 independent FMA chains
  } else {
    tile_loop<C, 3, 4>(t);  // 12 accumulators + 3 weight vectors + 1 act vector
  }
}

}  // namespace

void tile_f32(const MatmulTile& t) { tile_float<F32Conv>(t); }
void tile_f16(const MatmulTile& t) { tile_float<F16Conv>(t); }

// F16 in the x8 layout (repack.h): group g holds column c of its 8 rows at g + 16 c.
// Bit-identical to tile_f16 on the same weights: lane l of a row's accumulator there sums the
// columns c = l mod 8 in order; here acc[l] holds that sum for all 8 rows at once (one FMA per
// column with the same operands), and hsum_ps's tree is replayed across the accumulators.
void tile_x8_f16(const MatmulTile& t) {
  const int64_t k = t.k;
  const int64_t groups = (t.n_rows + 7) / 8;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* w = t.w + static_cast<size_t>(g) * t.w_stride;
    const int rows = static_cast<int>(std::min<int64_t>(8, t.n_rows - g * 8));
    // One act row at a time (8 accumulators leave no registers for more); the group's
    // 16 x k bytes stay in L1 for the next act. matmul() sends many act rows to the
    // row-major copy instead (Weight::row_major).
    for (int64_t i = 0; i < t.n_acts; ++i) {
      const float* x = reinterpret_cast<const float*>(t.a + static_cast<size_t>(i) * t.a_stride);
      __m256 acc[8];
      for (auto& a : acc) a = _mm256_setzero_ps();
      for (int64_t c = 0; c < k; c += 8) {
        const uint8_t* wc = w + static_cast<size_t>(c) * 16;
        for (int l = 0; l < 8; ++l) {
          acc[l] = _mm256_fmadd_ps(load_f16x8(wc + 16 * l), _mm256_broadcast_ss(x + c + l), acc[l]);
        }
      }
      const __m256 a0 = _mm256_add_ps(acc[0], acc[4]), a1 = _mm256_add_ps(acc[1], acc[5]);
      const __m256 a2 = _mm256_add_ps(acc[2], acc[6]), a3 = _mm256_add_ps(acc[3], acc[7]);
      // + 0.0f: tile_f16 adds its (empty) k % 8 tail the same way.
      const __m256 sum =
          _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3)), _mm256_setzero_ps());
      float* y = t.y + static_cast<size_t>(i) * t.y_stride + static_cast<size_t>(g) * 8;
      if (rows == 8) {
        _mm256_storeu_ps(y, sum);
      } else {
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, sum);
        std::memcpy(y, tmp, sizeof(float) * static_cast<size_t>(rows));
      }
    }
  }
}
void tile_bf16(const MatmulTile& t) { tile_float<BF16Conv>(t); }

}  // namespace metro::kernels::avx2
