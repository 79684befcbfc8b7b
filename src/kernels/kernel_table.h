// The per-instruction-set kernels behind matmul (internal to kernels/).
//
// One table per instruction set; active_kernels() picks one at first use from the CPU's
// features. Tests reach the others directly to check each against the reference.
//
// Every matmul kernel computes each output element the same way whatever tile it sits in:
// for the block formats, block by block in order, the exact integer sum of quant products
// turned into float and combined with the block's scales (see each table's file); for the
// float formats, per-lane sums over k in order and a fixed reduction. So results do not
// depend on the thread count, on how rows are grouped, or on m.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "kernels/dtype.h"

namespace metro {
class BumpArena;
}

namespace metro::kernels {

// Most act rows one tile holds (kernels may keep per-act state on the stack).
inline constexpr int64_t kMaxTileActs = 64;

// A rectangle of the output: weight rows [0, n_rows) of a tile times act rows [0, n_acts),
// n_acts <= kMaxTileActs.
struct MatmulTile {
  const uint8_t* w = nullptr;  // first weight row (row-major) or first 8-row group (x8)
  size_t w_stride = 0;         // bytes between weight rows, or between 8-row groups
  int64_t n_rows = 0;
  const uint8_t* a = nullptr;  // first act row, in the weight type's partner format
  size_t a_stride = 0;
  // Per-block act data (QuantizedActs), k/32 per act row, from the tile's first act row.
  const float* a_d = nullptr;
  const float* a_s = nullptr;
  const int32_t* a_sums = nullptr;
  int64_t n_acts = 0;
  int64_t k = 0;
  float* y = nullptr;  // y[i * y_stride + j]: act row i, weight row j of the tile
  size_t y_stride = 0;
};

// Where a quantizer also writes each block's d as float, s as float (Q8_1) and sum of
// quants (Q8_0); null members are not written. See QuantizedActs.
struct ActSide {
  float* d = nullptr;
  float* s = nullptr;
  int32_t* sums = nullptr;
};

using QuantizeRowFn = void (*)(const float* x, void* dst, int64_t k, const ActSide& side);
using TileFn = void (*)(const MatmulTile& t);

// Weight layouts (Weight::layout). Interleaved groups of 8 rows put the same block of
// the 8 rows side by side so one SIMD register holds 4 bytes of each row (repack.h).
inline constexpr int kLayoutRowMajor = 0;
inline constexpr int kLayoutX8 = 1;

struct KernelTable {
  std::string_view isa;
  // F32 -> partner rows, indexed by the partner type (Q8_0, Q8_1, Q8_K, F32).
  QuantizeRowFn quantize_row[kNumDTypes] = {};
  // Indexed by weight type: row-major and x8-interleaved kernels (null: no such kernel).
  TileFn tile_row_major[kNumDTypes] = {};
  TileFn tile_x8[kNumDTypes] = {};
};

const KernelTable& scalar_kernels();
// Null when the CPU lacks AVX2+FMA+F16C.
const KernelTable* avx2_kernels();
// The table matmul uses: the widest one the CPU runs.
const KernelTable& active_kernels();

// matmul (matmul.h) over an explicit table; tests use it to run every table.
struct Weight;
struct QuantizedActs;
void matmul_with(const KernelTable& kt, const Weight& w, const QuantizedActs& x, float* y,
                 size_t y_stride, int ith, int nth, std::atomic<int64_t>* next = nullptr);
QuantizedActs quantize_acts_with(const KernelTable& kt, DType weight_type, const float* x,
                                 int64_t m, int64_t k, size_t x_stride, uint8_t* out, int ith,
                                 int nth);
// make_weight for a given table (repacks only if the table has an x8 kernel for the type).
Weight make_weight_with(const KernelTable& kt, DType type, const void* data, int64_t n_rows,
                        int64_t n_cols, bool allow_repack, const std::shared_ptr<BumpArena>& arena = {});

}  // namespace metro::kernels
