// Internal to kernels/attention*: the work-item geometry and the per-ISA tile kernels.
//
// A work item is (sequence, KV head, tile of rows). The rows of a KV head are its query
// heads across the sequence's queries, query-major: row r is query r / group, head
// kv_head * group + r % group. So a tile shares every K/V row it reads among all of its
// rows, and the rows' causal limits (pos0 + r / group) rise with r.
//
// Every row is computed by the same sequence of float operations whatever tile it lands in
// (keys are scored in fixed chunks of kKeyChunk positions counted from 0; with a window, a
// row skips the chunks before its first key and masks that key's chunk below it), so
// results do not depend on the tiling or on the number of threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <cstring>
#include <string_view>

#include "base/fp16.h"
#include "kernels/attention.h"

namespace metro::kernels::detail {

inline constexpr int kMaxHeadDim = 256;
inline constexpr int kKeyChunk = kAttentionKeyChunk;  // keys per online-softmax step
inline constexpr int kMaxTileRows = 128;
inline constexpr int kMaxTileFloats = 8192;  // rows * head_dim of a tile's Q and accumulators

struct AttentionTile {
  int kv_head = 0;
  int row_begin = 0;
  int row_end = 0;
};

using AttentionTileFn = void (*)(const AttentionParams& p, const AttentionSeq& seq,
                                 const AttentionTile& tile);
// One K or V row of n values into its page format, bit-identical to quantize_row_ref.
using StoreRowFn = void (*)(const float* x, uint8_t* dst, int64_t n);

struct AttentionKernels {
  std::string_view isa;
  AttentionTileFn tile;
  StoreRowFn store_f16;   // dst: 2n bytes
  StoreRowFn store_q8_0;  // n a multiple of 32
};

extern const AttentionKernels kAttentionScalar;  // attention.cpp
extern const AttentionKernels kAttentionAvx2;    // attention_avx2.cpp

// Q8_0 keys are scored in integers, as llama.cpp scores a Q8_0 K cache: each (scaled)
// query row is quantized once to int8 with a float scale per 32 values, and a score is the
// sum over blocks of (query scale x key scale) x the block's int8 dot product. Every table
// quantizes queries with this one function, so the int8 rows are the same on every CPU.
inline void quantize_query_q8(const float* x, int hd, int8_t* q, float* d) {
  for (int b = 0; b < hd / 32; ++b) {
    float amax = 0.0f;
    bool finite = true;
    for (int i = 0; i < 32; ++i) {
      finite = finite && std::isfinite(x[b * 32 + i]);
      amax = std::max(amax, std::fabs(x[b * 32 + i]));
    }
    if (!finite) {  // a NaN or inf query must still poison its scores, as in the F16 path
      d[b] = std::numeric_limits<float>::quiet_NaN();
      std::fill(q + b * 32, q + b * 32 + 32, int8_t{0});
      continue;
    }
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    d[b] = amax / 127.0f;
    for (int i = 0; i < 32; ++i) {
      const float r = std::nearbyint(x[b * 32 + i] * inv);
      q[b * 32 + i] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
    }
  }
}

// A Q8_0 key row's score against a query row quantized by quantize_query_q8: over the
// blocks in order, acc = fma(S_b, dq_b x dk_b, acc) from 0, S_b the block's exact int8 dot
// product. Every table computes these bits (the AVX2 kernel by its own lanes); the CUDA
// backend's score_q8_row (backends/cuda/formats.h) is tested against this function.
inline float score_q8_ref(const int8_t* qi, const float* qd, const uint8_t* k, int hd) {
  float dot = 0.0f;
  for (int b = 0; b < hd / 32; ++b) {
    int32_t isum = 0;
    for (int i = 0; i < 32; ++i) {
      isum += int32_t{qi[b * 32 + i]} * int32_t{static_cast<int8_t>(k[b * 34 + 2 + i])};
    }
    uint16_t kd;
    std::memcpy(&kd, k + b * 34, 2);
    dot = std::fma(static_cast<float>(isum), qd[b] * fp16_to_fp32(kd), dot);
  }
  return dot;
}

// The first key position a query at qpos sees (0 without a window).
inline int64_t window_start(const AttentionParams& p, int64_t qpos) {
  return p.window > 0 ? std::max<int64_t>(0, qpos - p.window + 1) : 0;
}

// The kernels chosen for this CPU.
const AttentionKernels& attention_kernels();

// Rows per tile: as many whole query groups as fit kMaxTileRows and kMaxTileFloats.
int attention_tile_rows(int group, int head_dim);

// attention() with an explicit kernel table (tests run every table present on the CPU).
void attention_with(const AttentionKernels& k, const AttentionParams& p,
                    std::span<const AttentionSeq> seqs, int ith, int nth);
// kv_store() with an explicit kernel table.
void kv_store_with(const AttentionKernels& k, const KvPageLayout& layout, uint8_t* page, int slot,
                   const float* x);

// The K (or V) rows of one KV head of a sequence, spread over its pages. Sizes are taken
// from the layout once, and walks go page by page, so there is no division per row.
class PagedRows {
 public:
  PagedRows(const KvPageLayout& l, const uint8_t* const* pages, int kv_head)
      : pages_(pages),
        head_offset_(static_cast<size_t>(kv_head) * l.head_bytes()),
        row_bytes_(l.row_bytes()),
        block_size_(l.block_size) {}

  size_t row_bytes() const { return row_bytes_; }

  const uint8_t* row(int64_t pos) const {
    return pages_[pos / block_size_] + head_offset_ +
           static_cast<size_t>(pos % block_size_) * row_bytes_;
  }

  // fn(first_j, rows, count) for each run of contiguous rows covering positions
  // [from, from + n): rows of positions from + first_j ... from + first_j + count - 1.
  template <class Fn>
  void for_each_run(int64_t from, int n, Fn&& fn) const {
    int64_t page = from / block_size_;
    int slot = static_cast<int>(from % block_size_);
    for (int j = 0; j < n; ++page, slot = 0) {
      const int count = std::min(n - j, block_size_ - slot);
      fn(j, pages_[page] + head_offset_ + static_cast<size_t>(slot) * row_bytes_, count);
      j += count;
    }
  }

 private:
  const uint8_t* const* pages_;
  size_t head_offset_;
  size_t row_bytes_;
  int block_size_;
};

}  // namespace metro::kernels::detail
