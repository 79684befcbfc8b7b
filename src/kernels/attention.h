// Causal attention over a paged KV cache, flash style (online softmax, one pass over keys),
// grouped-query aware: the keys and values of one KV head are read once for all the query
// heads of its group.
//
// KV memory is a list of pages (blocks of `block_size` tokens) per layer. Inside a page,
// K and V are each stored head-major: [n_head_kv][block_size][row], a row being head_dim
// elements in `type` (F16, or Q8_0 blocks of 32). Head-major keeps one head's keys
// contiguous, which is what a GQA group reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/dtype.h"

namespace metro::kernels {

struct KvPageLayout {
  DType type = DType::kF16;  // F16 or Q8_0
  int block_size = 16;       // tokens per page
  int n_head_kv = 0;
  int head_dim = 0;

  size_t row_bytes() const { return kernels::row_bytes(type, head_dim); }
  size_t head_bytes() const { return row_bytes() * static_cast<size_t>(block_size); }
  size_t page_bytes() const { return head_bytes() * static_cast<size_t>(n_head_kv); }
};

// Writes one token's K or V (x: [n_head_kv][head_dim] F32) into slot `slot` of a page.
void kv_store(const KvPageLayout& layout, uint8_t* page, int slot, const float* x);
// Reads one token's row back to F32 (tests, debugging).
void kv_load(const KvPageLayout& layout, const uint8_t* page, int slot, int head, float* out);

// One sequence's queries in a step. Query i sits at position pos0 + i and attends to keys
// at positions [0, pos0 + i] (causal), or with a window w to the last w of them,
// [max(0, pos0 + i - w + 1), pos0 + i]; keys of all those positions are already stored.
// Key position p lives in page p / block_size, slot p % block_size.
struct AttentionSeq {
  const float* q = nullptr;  // [n_q][n_head][head_dim]
  float* out = nullptr;      // [n_q][n_head][head_dim]
  int n_q = 0;
  int64_t pos0 = 0;
  const uint8_t* const* k_pages = nullptr;  // this layer's K page of each block
  const uint8_t* const* v_pages = nullptr;  // this layer's V page of each block
  size_t q_stride = 0;                      // floats between query tokens
  size_t out_stride = 0;                    // floats between output tokens
};

// The kernels score keys in chunks of this many positions counted from 0: with a window, a
// query's keys are read from the start of the chunk holding its window's first key.
inline constexpr int kAttentionKeyChunk = 32;

// The first key position read for a query at `qpos` with a window of `window` keys by
// kernels that read from a multiple of `align` (kAttentionKeyChunk for these): the KV of
// positions before it is never read again by queries from qpos on.
inline int64_t window_first_read(int64_t qpos, int64_t window, int64_t align) {
  const int64_t first = qpos - window + 1;
  return first > 0 ? first / align * align : 0;
}

struct AttentionParams {
  KvPageLayout layout;
  int n_head = 0;
  float scale = 0.0f;  // usually 1/sqrt(head_dim)
  // Sliding-window attention: a query sees its own key and the window - 1 keys before it.
  // 0: every earlier key (full causal attention). Keys before a query's window weigh
  // nothing, but the kernels may still read those in the 32-key chunk that holds its first
  // key, so every stored position's page must stay valid.
  int64_t window = 0;
  // Soft-capping of the scaled scores: s becomes softcap * tanh(s / softcap) before the
  // softmax (gemma2). 0: none.
  float softcap = 0.0f;
};

// Thread ith's share of attention for every sequence of a step. Work is split into items
// (sequence, KV head, tile of queries) dealt out to threads; no allocation.
// Preconditions (METRO_CHECK): head_dim a multiple of 8 (of 32 for Q8_0) and at most 256;
// n_head a multiple of n_head_kv. Query head h reads KV head h / (n_head / n_head_kv).
// Scratch is on the stack (about 150 KiB per call), and every item's result is the same
// whatever nth is, so outputs are bit-identical for any thread count.
void attention(const AttentionParams& p, std::span<const AttentionSeq> seqs, int ith, int nth);

// Scalar reference: dense softmax in double over the same pages.
void attention_ref(const AttentionParams& p, const AttentionSeq& seq);

}  // namespace metro::kernels
