// Paged attention: KV page access, the split of a step's attention into work items, and
// the portable (scalar) tile kernel. The AVX2 tile kernel is in attention_avx2.cpp.
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/check.h"
#include "base/cpu_features.h"
#include "base/fp16.h"
#include "kernels/attention_impl.h"
#include "kernels/quant_ref.h"

namespace metro::kernels {

namespace detail {

namespace {

void check_layout(const KvPageLayout& l) {
  METRO_CHECK_MSG(l.type == DType::kF16 || l.type == DType::kQ8_0,
                  "KV pages must be F16 or Q8_0");
  METRO_CHECK_MSG(l.block_size > 0 && l.n_head_kv > 0, "KV layout: empty page geometry");
  METRO_CHECK_MSG(l.head_dim > 0 && l.head_dim <= kMaxHeadDim && l.head_dim % 8 == 0,
                  "KV layout: head_dim must be a multiple of 8 and at most 256");
  METRO_CHECK_MSG(l.type != DType::kQ8_0 || l.head_dim % 32 == 0,
                  "KV layout: Q8_0 pages need head_dim a multiple of 32");
}

void store_f16_scalar(const float* x, uint8_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = fp32_to_fp16(x[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

void store_q8_0_scalar(const float* x, uint8_t* dst, int64_t n) { quantize_row_ref(DType::kQ8_0, x, dst, n); }

// The tile kernel's algorithm in plain C++ (for CPUs without AVX2): per chunk of keys,
// score every row, update its running max / sum and rescale its accumulator once.
void tile_scalar(const AttentionParams& p, const AttentionSeq& seq, const AttentionTile& t) {
  const KvPageLayout& lay = p.layout;
  const int hd = lay.head_dim;
  const int group = p.n_head / lay.n_head_kv;
  const int rows = t.row_end - t.row_begin;
  float q[kMaxTileFloats];
  float acc[kMaxTileFloats];
  float kf[kKeyChunk * kMaxHeadDim];
  float vf[kKeyChunk * kMaxHeadDim];
  float s[kKeyChunk];
  float m[kMaxTileRows];
  float l[kMaxTileRows];
  int64_t qpos[kMaxTileRows];
  const bool q8 = lay.type == DType::kQ8_0;
  const int nb = hd / 32;
  int8_t qi[kMaxTileFloats];
  float qd[kMaxTileFloats / 32];
  for (int r = 0; r < rows; ++r) {
    const int row = t.row_begin + r;
    const int query = row / group;
    const int h = t.kv_head * group + row % group;
    const float* src = seq.q + static_cast<size_t>(query) * seq.q_stride + static_cast<size_t>(h) * hd;
    for (int d = 0; d < hd; ++d) q[r * hd + d] = src[d] * p.scale;
    std::fill(acc + r * hd, acc + (r + 1) * hd, 0.0f);
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0f;
    qpos[r] = seq.pos0 + query;
    if (q8) quantize_query_q8(q + r * hd, hd, qi + r * hd, qd + r * nb);
  }
  const PagedRows keys(lay, seq.k_pages, t.kv_head);
  const PagedRows values(lay, seq.v_pages, t.kv_head);
  const int64_t last = qpos[rows - 1];
  for (int64_t kb = window_start(p, qpos[0]) / kKeyChunk * kKeyChunk; kb <= last; kb += kKeyChunk) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeyChunk, last + 1 - kb));
    for (int j = 0; j < nk; ++j) {
      if (!q8) dequantize_row_ref(lay.type, keys.row(kb + j), kf + j * hd, hd);  // Q8_0 keys: read as int8
      dequantize_row_ref(lay.type, values.row(kb + j), vf + j * hd, hd);
    }
    for (int r = 0; r < rows; ++r) {
      const int64_t valid = std::min<int64_t>(nk, qpos[r] + 1 - kb);
      const int64_t lo = std::max<int64_t>(0, window_start(p, qpos[r]) - kb);
      if (valid <= lo) continue;
      float mx = m[r];
      for (int j = static_cast<int>(lo); j < valid; ++j) {
        float dot = 0.0f;
        if (q8) {  // int8 query row against the key's int8 blocks, in the AVX2 kernel's order
          dot = score_q8_ref(qi + r * hd, qd + r * nb, keys.row(kb + j), hd);
        } else {
          for (int d = 0; d < hd; ++d) dot += q[r * hd + d] * kf[j * hd + d];
        }
        if (p.softcap > 0.0f) dot = p.softcap * std::tanh(dot / p.softcap);
        s[j] = dot;
        mx = std::max(mx, dot);
      }
      const float alpha = std::exp(m[r] - mx);
      float sum = 0.0f;
      float* a = acc + r * hd;
      for (int d = 0; d < hd; ++d) a[d] *= alpha;
      for (int j = static_cast<int>(lo); j < valid; ++j) {
        const float pj = std::exp(s[j] - mx);
        sum += pj;
        for (int d = 0; d < hd; ++d) a[d] += pj * vf[j * hd + d];
      }
      l[r] = l[r] * alpha + sum;
      m[r] = mx;
    }
  }
  for (int r = 0; r < rows; ++r) {
    const int row = t.row_begin + r;
    const int query = row / group;
    const int h = t.kv_head * group + row % group;
    float* dst = seq.out + static_cast<size_t>(query) * seq.out_stride + static_cast<size_t>(h) * hd;
    const float inv = 1.0f / l[r];
    for (int d = 0; d < hd; ++d) dst[d] = acc[r * hd + d] * inv;
  }
}

// sum_{r < n} floor(r / g)
int64_t floor_div_prefix(int64_t n, int64_t g) {
  const int64_t q = n / g;
  return g * q * (q - 1) / 2 + (n % g) * q;
}

// Estimated cost of a tile, in units of one (row, key) score + accumulate: every row's keys,
// plus reading and converting each K/V row once, plus a fixed per-item overhead.
int64_t tile_cost(const AttentionParams& p, const AttentionSeq& seq, int group, int r0, int r1) {
  if (p.window > 0) {
    int64_t keys = 0;
    for (int r = r0; r < r1; ++r) keys += std::min<int64_t>(seq.pos0 + r / group + 1, p.window);
    const int64_t first = window_start(p, seq.pos0 + r0 / group);
    return keys + 4 * (seq.pos0 + (r1 - 1) / group + 1 - first) + 64;
  }
  const int64_t rows = r1 - r0;
  const int64_t keys = rows * (seq.pos0 + 1) + floor_div_prefix(r1, group) -
                       floor_div_prefix(r0, group);
  const int64_t kv_rows = seq.pos0 + (r1 - 1) / group + 1;
  return keys + 4 * kv_rows + 64;
}

// Calls fn(seq, tile, cost) for every work item of the step, in one fixed order.
template <class Fn>
void for_each_item(const AttentionParams& p, std::span<const AttentionSeq> seqs, Fn&& fn) {
  const int group = p.n_head / p.layout.n_head_kv;
  const int tile_rows = attention_tile_rows(group, p.layout.head_dim);
  for (const AttentionSeq& seq : seqs) {
    const int total_rows = seq.n_q * group;
    for (int kvh = 0; kvh < p.layout.n_head_kv; ++kvh) {
      for (int r0 = 0; r0 < total_rows; r0 += tile_rows) {
        const int r1 = std::min(total_rows, r0 + tile_rows);
        fn(seq, AttentionTile{kvh, r0, r1}, tile_cost(p, seq, group, r0, r1));
      }
    }
  }
}

}  // namespace

const AttentionKernels kAttentionScalar = {"scalar", tile_scalar, store_f16_scalar, store_q8_0_scalar};

const AttentionKernels& attention_kernels() {
  static const AttentionKernels& k =
      cpu_features().has_avx2_level() ? kAttentionAvx2 : kAttentionScalar;
  return k;
}

int attention_tile_rows(int group, int head_dim) {
  const int max_rows = std::min(kMaxTileRows, kMaxTileFloats / head_dim);
  return group <= max_rows ? max_rows / group * group : max_rows;
}

// Items are dealt out as contiguous runs of the fixed item order, balanced by estimated
// cost: item i goes to the thread whose share of the total cost holds the item's midpoint.
// Every thread computes the same split on its own, so nothing is shared or allocated.
void attention_with(const AttentionKernels& k, const AttentionParams& p,
                    std::span<const AttentionSeq> seqs, int ith, int nth) {
  check_layout(p.layout);
  METRO_CHECK_MSG(p.n_head > 0 && p.n_head % p.layout.n_head_kv == 0,
                  "attention: n_head must be a positive multiple of n_head_kv");
  METRO_CHECK(nth > 0 && ith >= 0 && ith < nth);
  int64_t total = 0;
  for_each_item(p, seqs, [&](const AttentionSeq&, const AttentionTile&, int64_t cost) {
    total += cost;
  });
  if (total == 0) return;
  int64_t start = 0;
  for_each_item(p, seqs, [&](const AttentionSeq& seq, const AttentionTile& tile, int64_t cost) {
    const int64_t owner = (2 * start + cost) * nth / (2 * total);
    start += cost;
    if (owner == ith) k.tile(p, seq, tile);
  });
}

void kv_store_with(const AttentionKernels& k, const KvPageLayout& layout, uint8_t* page, int slot,
                   const float* x) {
  check_layout(layout);
  METRO_CHECK(slot >= 0 && slot < layout.block_size);
  for (int h = 0; h < layout.n_head_kv; ++h) {
    uint8_t* dst = page + static_cast<size_t>(h) * layout.head_bytes() +
                   static_cast<size_t>(slot) * layout.row_bytes();
    const float* src = x + static_cast<size_t>(h) * layout.head_dim;
    if (layout.type == DType::kF16) {
      k.store_f16(src, dst, layout.head_dim);
    } else {
      k.store_q8_0(src, dst, layout.head_dim);
    }
  }
}

}  // namespace detail

void kv_store(const KvPageLayout& layout, uint8_t* page, int slot, const float* x) {
  detail::kv_store_with(detail::attention_kernels(), layout, page, slot, x);
}

void kv_load(const KvPageLayout& layout, const uint8_t* page, int slot, int head, float* out) {
  detail::check_layout(layout);
  METRO_CHECK(slot >= 0 && slot < layout.block_size && head >= 0 && head < layout.n_head_kv);
  const uint8_t* src = page + static_cast<size_t>(head) * layout.head_bytes() +
                       static_cast<size_t>(slot) * layout.row_bytes();
  dequantize_row_ref(layout.type, src, out, layout.head_dim);
}

void attention(const AttentionParams& p, std::span<const AttentionSeq> seqs, int ith, int nth) {
  detail::attention_with(detail::attention_kernels(), p, seqs, ith, nth);
}

}  // namespace metro::kernels
