// matmul's driver: weight wrapping and repacking, activation quantization, and the split
// of the output among threads. The arithmetic is in the kernel tables (kernel_table.h).
#include "kernels/matmul.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/cpu_features.h"
#include "kernels/kernel_table.h"
#include "kernels/quant_blocks.h"
#include "kernels/quant_ref.h"
#include "kernels/repack.h"

namespace metro::kernels {

// Defined in matmul_avx2.cpp; only called once the CPU is known to run it.
const KernelTable& avx2_table();

namespace {

// Up to this many act rows, the whole of x is one tile column (GEMV: weights stream once
// and every weight block loaded serves all rows). Beyond it, acts are cut into chunks
// that stay in L2 while the weight rows of a thread's share pass over them.
constexpr int64_t kGemvMaxActs = 4;
constexpr int64_t kActChunk = kMaxTileActs;

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

int64_t partner_block(DType weight_type) { return traits(traits(weight_type).dot_partner).block_size; }

}  // namespace

const KernelTable* avx2_kernels() {
  if (!cpu_features().has_avx2_level()) return nullptr;
  return &avx2_table();
}

const KernelTable& active_kernels() {
  static const KernelTable& table = avx2_kernels() ? *avx2_kernels() : scalar_kernels();
  return table;
}

std::string_view kernel_isa() { return active_kernels().isa; }

std::string Weight::describe() const {
  std::string s(dtype_name(type));
  s += layout == kLayoutX8 ? " x8 interleaved" : " row-major";
  if (row_major != nullptr) s += " (row-major for prefill)";
  return s;
}

std::vector<std::span<const uint8_t>> Weight::memory() const {
  std::vector<std::span<const uint8_t>> out;
  if (data == nullptr) return out;
  const size_t row_major_bytes = static_cast<size_t>(n_rows) * row_stride;
  out.emplace_back(data, layout == kLayoutX8 ? x8_bytes(type, n_rows, n_cols) : row_major_bytes);
  if (row_major != nullptr) out.emplace_back(row_major, row_major_bytes);
  return out;
}

Weight make_weight_with(const KernelTable& kt, DType type, const void* data, int64_t n_rows,
                        int64_t n_cols, bool allow_repack, const std::shared_ptr<BumpArena>& arena) {
  METRO_CHECK(n_rows > 0 && n_cols > 0 && n_cols % traits(type).block_size == 0);
  Weight w;
  w.type = type;
  w.n_rows = n_rows;
  w.n_cols = n_cols;
  w.data = static_cast<const uint8_t*>(data);
  w.row_stride = row_bytes(type, n_cols);
  if (allow_repack && can_repack_x8(type, n_cols) && kt.tile_x8[static_cast<int>(type)] != nullptr) {
    const size_t bytes = x8_bytes(type, n_rows, n_cols);
    uint8_t* dst = nullptr;
    if (arena) {
      dst = arena->take(bytes);
      w.owned = arena;
    } else {
      auto own = std::make_shared<AlignedBuffer<uint8_t>>(bytes);
      dst = own->data();
      w.owned = std::move(own);
    }
    repack_x8(type, w.data, w.row_stride, n_rows, n_cols, dst);
    if (type == DType::kF16) w.row_major = w.data;
    w.data = dst;
    w.layout = kLayoutX8;
  }
  return w;
}

Weight make_weight(DType type, const void* data, int64_t n_rows, int64_t n_cols, bool allow_repack,
                   const std::shared_ptr<BumpArena>& arena) {
  return make_weight_with(active_kernels(), type, data, n_rows, n_cols, allow_repack, arena);
}

size_t quantized_acts_bytes(DType weight_type, int64_t m, int64_t k) {
  const DType p = traits(weight_type).dot_partner;
  size_t bytes = align64(static_cast<size_t>(m) * row_bytes(p, k));
  if (p == DType::kQ8_0 || p == DType::kQ8_1) bytes += 2 * align64(static_cast<size_t>(m * (k / kQK)) * 4);
  return bytes;
}

QuantizedActs quantize_acts_with(const KernelTable& kt, DType weight_type, const float* x,
                                 int64_t m, int64_t k, size_t x_stride, uint8_t* out, int ith,
                                 int nth) {
  const DType p = traits(weight_type).dot_partner;
  const int64_t bs = partner_block(weight_type);
  METRO_CHECK(k % bs == 0 && m >= 0);
  QuantizedActs q;
  q.type = p;
  q.m = m;
  q.k = k;
  q.data = out;
  q.row_stride = row_bytes(p, k);
  // Side arrays after the rows: d, then s (Q8_1) or the quant sums (Q8_0).
  float* side_d = nullptr;
  uint8_t* side_2 = nullptr;
  if (p == DType::kQ8_0 || p == DType::kQ8_1) {
    const size_t rows_bytes = align64(static_cast<size_t>(m) * q.row_stride);
    side_d = reinterpret_cast<float*>(out + rows_bytes);
    side_2 = out + rows_bytes + align64(static_cast<size_t>(m * (k / kQK)) * 4);
    q.block_d = side_d;
    if (p == DType::kQ8_1) q.block_s = reinterpret_cast<const float*>(side_2);
    if (p == DType::kQ8_0) q.block_sums = reinterpret_cast<const int32_t*>(side_2);
  }
  // Blocks are independent: threads take equal runs of the flattened (row, block) list.
  const int64_t nb = k / bs;
  const int64_t total = m * nb;
  const int64_t u0 = total * ith / nth, u1 = total * (ith + 1) / nth;
  const QuantizeRowFn quantize = kt.quantize_row[static_cast<int>(p)];
  const size_t bpb = static_cast<size_t>(traits(p).bytes_per_block);
  for (int64_t u = u0; u < u1;) {
    const int64_t i = u / nb, b0 = u % nb;
    const int64_t b1 = std::min(nb, b0 + (u1 - u));
    uint8_t* dst = out + static_cast<size_t>(i) * q.row_stride + static_cast<size_t>(b0) * bpb;
    ActSide side;
    if (side_d) {
      const size_t at = static_cast<size_t>(i * nb + b0);
      side.d = side_d + at;
      if (p == DType::kQ8_1) side.s = reinterpret_cast<float*>(side_2) + at;
      if (p == DType::kQ8_0) side.sums = reinterpret_cast<int32_t*>(side_2) + at;
    }
    quantize(x + static_cast<size_t>(i) * x_stride + static_cast<size_t>(b0 * bs), dst, (b1 - b0) * bs, side);
    u += b1 - b0;
  }
  return q;
}

QuantizedActs acts_rows(const QuantizedActs& x, int64_t first, int64_t n) {
  METRO_CHECK(first >= 0 && n >= 0 && first + n <= x.m);
  QuantizedActs v = x;
  v.m = n;
  v.data = x.data + static_cast<size_t>(first) * x.row_stride;
  const size_t side = static_cast<size_t>(first * (x.k / kQK));  // the side arrays' values per row: k / 32
  if (v.block_d) v.block_d += side;
  if (v.block_s) v.block_s += side;
  if (v.block_sums) v.block_sums += side;
  return v;
}

QuantizedActs quantize_acts(DType weight_type, const float* x, int64_t m, int64_t k,
                            size_t x_stride, uint8_t* out, int ith, int nth) {
  return quantize_acts_with(active_kernels(), weight_type, x, m, k, x_stride, out, ith, nth);
}

void matmul_with(const KernelTable& kt, const Weight& w, const QuantizedActs& x, float* y,
                 size_t y_stride, int ith, int nth, std::atomic<int64_t>* next) {
  METRO_CHECK(x.k == w.n_cols && x.type == traits(w.type).dot_partner);
  METRO_CHECK_MSG((x.type != DType::kQ8_0 && x.type != DType::kQ8_1) || x.block_d != nullptr,
                  "matmul: acts must come from quantize_acts");
  if (w.row_major != nullptr && x.m > kGemvMaxActs) {
    Weight rm;
    rm.type = w.type;
    rm.n_rows = w.n_rows;
    rm.n_cols = w.n_cols;
    rm.data = w.row_major;
    rm.row_stride = w.row_stride;
    matmul_with(kt, rm, x, y, y_stride, ith, nth, next);
    return;
  }
  const TileFn fn = w.layout == kLayoutX8 ? kt.tile_x8[static_cast<int>(w.type)]
                                          : kt.tile_row_major[static_cast<int>(w.type)];
  METRO_CHECK_MSG(fn != nullptr, "matmul: no kernel for this weight type and layout");
  if (x.m == 0) return;
  const int64_t groups = (w.n_rows + kX8Rows - 1) / kX8Rows;
  const int64_t chunk = x.m <= kGemvMaxActs ? x.m : kActChunk;
  const int64_t n_chunks = (x.m + chunk - 1) / chunk;
  const size_t group_stride = w.layout == kLayoutX8 ? x8_group_stride(w.type, w.n_cols)
                                                    : kX8Rows * w.row_stride;
  const int64_t nb = x.k / partner_block(w.type);
  // Units are (act chunk, 8-row group) pairs, chunk-major; each thread takes an equal run,
  // or with `next` claims runs of `grain` units until none are left. Every output element
  // is computed the same way in any tile, so the split never changes results.
  const int64_t total = groups * n_chunks;
  auto run_units = [&](int64_t u, const int64_t u1) {
    while (u < u1) {
      const int64_t c = u / groups, g0 = u % groups;
      const int64_t g1 = std::min(groups, g0 + (u1 - u));
      MatmulTile t;
      t.w = w.data + static_cast<size_t>(g0) * group_stride;
      t.w_stride = w.layout == kLayoutX8 ? group_stride : w.row_stride;
      t.n_rows = std::min(w.n_rows, g1 * kX8Rows) - g0 * kX8Rows;
      const int64_t i0 = c * chunk;
      t.a = x.data + static_cast<size_t>(i0) * x.row_stride;
      t.a_stride = x.row_stride;
      t.a_d = x.block_d ? x.block_d + i0 * nb : nullptr;
      t.a_s = x.block_s ? x.block_s + i0 * nb : nullptr;
      t.a_sums = x.block_sums ? x.block_sums + i0 * nb : nullptr;
      t.n_acts = std::min(x.m, i0 + chunk) - i0;
      t.k = x.k;
      t.y = y + static_cast<size_t>(i0) * y_stride + static_cast<size_t>(g0 * kX8Rows);
      t.y_stride = y_stride;
      fn(t);
      u += g1 - g0;
    }
  };
  if (next == nullptr || nth == 1) {
    run_units(total * ith / nth, total * (ith + 1) / nth);
    return;
  }
  // About eight claims per thread: few enough that the counter's cache line does not
  // bounce, enough that a late thread's share shrinks to what it can do.
  const int64_t grain = std::max<int64_t>(1, total / (8 * static_cast<int64_t>(nth)));
  for (;;) {
    const int64_t u = next->fetch_add(grain, std::memory_order_relaxed);
    if (u >= total) return;
    run_units(u, std::min(total, u + grain));
  }
}

void matmul(const Weight& w, const QuantizedActs& x, float* y, size_t y_stride, int ith, int nth,
            std::atomic<int64_t>* next) {
  matmul_with(active_kernels(), w, x, y, y_stride, ith, nth, next);
}

void matmul_ref(const Weight& w, const float* x, int64_t m, size_t x_stride, float* y, size_t y_stride) {
  std::vector<float> row(static_cast<size_t>(w.n_cols));
  std::vector<uint8_t> blocks(static_cast<size_t>(kX8Rows * traits(w.type).bytes_per_block));
  const int64_t bs = traits(w.type).block_size;
  for (int64_t j = 0; j < w.n_rows; ++j) {
    if (w.layout == kLayoutX8) {
      // Back to GGUF blocks, one block of the row at a time.
      const uint8_t* group = w.data + static_cast<size_t>(j / kX8Rows) * x8_group_stride(w.type, w.n_cols);
      for (int64_t b = 0; b < w.n_cols / bs; ++b) {
        unpack_x8_block(w.type, group + static_cast<size_t>(b) * x8_block_bytes(w.type), blocks.data());
        dequantize_row_ref(w.type, blocks.data() + (j % kX8Rows) * traits(w.type).bytes_per_block,
                           row.data() + b * bs, bs);
      }
    } else {
      dequantize_row_ref(w.type, w.data + static_cast<size_t>(j) * w.row_stride, row.data(), w.n_cols);
    }
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + static_cast<size_t>(i) * x_stride;
      double acc = 0.0;
      for (int64_t c = 0; c < w.n_cols; ++c) acc += static_cast<double>(row[c]) * xi[c];
      y[static_cast<size_t>(i) * y_stride + static_cast<size_t>(j)] = static_cast<float>(acc);
    }
  }
}

}  // namespace metro::kernels
