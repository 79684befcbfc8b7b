// Paged attention against the dense double-precision reference, for every kernel table the
// CPU can run, across sequence mixes, GQA shapes, page sizes and KV types; thread-count
// independence; causality; KV page storage.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "base/cpu_features.h"
#include "base/fp16.h"
#include "base/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/attention_impl.h"
#include "kernels/kernel_test_util.h"
#include "kernels/ops.h"
#include "kernels/quant_ref.h"

namespace metro::kernels {
namespace {

std::vector<const detail::AttentionKernels*> kernel_tables() {
  std::vector<const detail::AttentionKernels*> t = {&detail::kAttentionScalar};
  if (cpu_features().has_avx2_level()) t.push_back(&detail::kAttentionAvx2);
  return t;
}

// One sequence's queries, pages and outputs. Pages start as 0xFF bytes (NaN in F16, a NaN
// scale in Q8_0), so any read of a slot that was never written poisons the result.
struct SeqData {
  int n_q = 0;
  int64_t pos0 = 0;
  std::vector<float> q;
  std::vector<std::vector<uint8_t>> k_pages, v_pages;
  std::vector<const uint8_t*> k_ptrs, v_ptrs;
  std::vector<float> out;

  AttentionSeq view(int n_head, int head_dim) {
    AttentionSeq s;
    s.q = q.data();
    s.out = out.data();
    s.n_q = n_q;
    s.pos0 = pos0;
    s.k_pages = k_ptrs.data();
    s.v_pages = v_ptrs.data();
    s.q_stride = static_cast<size_t>(n_head) * head_dim;
    s.out_stride = static_cast<size_t>(n_head) * head_dim;
    return s;
  }
};

struct Shape {
  int n_head;
  int n_head_kv;
  int head_dim;
  int block_size;
  DType type;
};

KvPageLayout layout_of(const Shape& sh) {
  KvPageLayout l;
  l.type = sh.type;
  l.block_size = sh.block_size;
  l.n_head_kv = sh.n_head_kv;
  l.head_dim = sh.head_dim;
  return l;
}

AttentionParams params_of(const Shape& sh, float scale, int64_t window = 0) {
  AttentionParams p;
  p.layout = layout_of(sh);
  p.n_head = sh.n_head;
  p.scale = scale;
  p.window = window;
  return p;
}

SeqData make_seq(const Shape& sh, int n_q, int64_t pos0, uint32_t seed) {
  const KvPageLayout lay = layout_of(sh);
  SeqData d;
  d.n_q = n_q;
  d.pos0 = pos0;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  // Queries a little larger than keys so some softmaxes are peaked and some flat.
  d.q.resize(static_cast<size_t>(n_q) * sh.n_head * sh.head_dim);
  for (auto& x : d.q) x = 2.5f * unit(rng);
  d.out.assign(d.q.size(), -12345.0f);
  const int64_t n_keys = pos0 + n_q;
  const int64_t n_pages = (n_keys + sh.block_size - 1) / sh.block_size;
  for (int64_t b = 0; b < n_pages; ++b) {
    d.k_pages.emplace_back(lay.page_bytes(), uint8_t{0xFF});
    d.v_pages.emplace_back(lay.page_bytes(), uint8_t{0xFF});
  }
  std::vector<float> row(static_cast<size_t>(sh.n_head_kv) * sh.head_dim);
  for (int64_t pos = 0; pos < n_keys; ++pos) {
    const int slot = static_cast<int>(pos % sh.block_size);
    for (auto& x : row) x = unit(rng);
    kv_store(lay, d.k_pages[pos / sh.block_size].data(), slot, row.data());
    for (auto& x : row) x = 3.0f * unit(rng);
    kv_store(lay, d.v_pages[pos / sh.block_size].data(), slot, row.data());
  }
  for (auto& p : d.k_pages) d.k_ptrs.push_back(p.data());
  for (auto& p : d.v_pages) d.v_ptrs.push_back(p.data());
  return d;
}

// The dense K and V rows of a sequence (kernel_test_util.h bounds each output row from them).
struct DenseKv {
  std::vector<float> k, v;  // [n_head_kv][n_keys][head_dim]
  int64_t n_keys = 0;
};

DenseKv dense_kv(const Shape& sh, const SeqData& d) {
  const KvPageLayout lay = layout_of(sh);
  DenseKv kv;
  kv.n_keys = d.pos0 + d.n_q;
  kv.k.resize(static_cast<size_t>(sh.n_head_kv * kv.n_keys * sh.head_dim));
  kv.v.resize(kv.k.size());
  for (int h = 0; h < sh.n_head_kv; ++h) {
    for (int64_t pos = 0; pos < kv.n_keys; ++pos) {
      const int slot = static_cast<int>(pos % sh.block_size);
      const size_t off = static_cast<size_t>((h * kv.n_keys + pos) * sh.head_dim);
      kv_load(lay, d.k_pages[pos / sh.block_size].data(), slot, h, kv.k.data() + off);
      kv_load(lay, d.v_pages[pos / sh.block_size].data(), slot, h, kv.v.data() + off);
    }
  }
  return kv;
}

double max_abs_value(const Shape& sh, const DenseKv& kv, int h) {
  const int kvh = h / (sh.n_head / sh.n_head_kv);
  double m = 0.0;
  for (int64_t i = 0; i < kv.n_keys * sh.head_dim; ++i) {
    m = std::max(m, std::fabs(static_cast<double>(kv.v[static_cast<size_t>(kvh * kv.n_keys * sh.head_dim + i)])));
  }
  return m;
}

double row_tolerance(const Shape& sh, const AttentionParams& p, const SeqData& d,
                     const DenseKv& kv, int i, int h, int score_depth) {
  const int kvh = h / (sh.n_head / sh.n_head_kv);
  const float* q = d.q.data() + (static_cast<size_t>(i) * sh.n_head + h) * sh.head_dim;
  const int64_t visible = d.pos0 + i + 1;
  const int64_t first = p.window > 0 ? std::max<int64_t>(0, visible - p.window) : 0;
  const size_t head = static_cast<size_t>((kvh * kv.n_keys + first) * sh.head_dim);
  return testing::attention_row_tolerance(q, kv.k.data() + head, kv.v.data() + head, visible - first,
                                          sh.head_dim, p.scale, score_depth);
}

// Q8_0 keys are scored against each query rounded to int8 per block of 32
// (detail::quantize_query_q8), as llama.cpp scores a Q8_0 K cache. The reference is then run
// on those rounded queries, so the bound above checks the kernels' arithmetic, not the
// rounding (which is far below the bound's worst case and would hide a wrong scale).
SeqData with_q8_queries(const Shape& sh, const AttentionParams& p, const SeqData& d) {
  SeqData r = d;
  if (sh.type != DType::kQ8_0) return r;
  std::vector<float> scaled(static_cast<size_t>(sh.head_dim));
  std::vector<int8_t> qi(scaled.size());
  std::vector<float> qd(scaled.size() / 32);
  for (size_t row = 0; row + sh.head_dim <= r.q.size(); row += sh.head_dim) {
    for (int c = 0; c < sh.head_dim; ++c) scaled[c] = r.q[row + c] * p.scale;
    detail::quantize_query_q8(scaled.data(), sh.head_dim, qi.data(), qd.data());
    for (int c = 0; c < sh.head_dim; ++c) {
      r.q[row + c] = static_cast<float>(static_cast<double>(qi[c]) * qd[c / 32] / p.scale);
    }
  }
  for (size_t b = 0; b < r.k_pages.size(); ++b) {  // the copy's views point at its own pages
    r.k_ptrs[b] = r.k_pages[b].data();
    r.v_ptrs[b] = r.v_pages[b].data();
  }
  return r;
}

struct Case {
  std::string name;
  Shape shape;
  std::vector<std::pair<int, int64_t>> seqs;  // (n_q, pos0)
  int64_t window = 0;
  float softcap = 0.0f;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class AttentionTest : public ::testing::TestWithParam<Case> {};

void run_attention(const detail::AttentionKernels& k, const AttentionParams& p,
                   std::vector<SeqData>& data, int nth) {
  std::vector<AttentionSeq> views;
  for (auto& d : data) {
    std::fill(d.out.begin(), d.out.end(), -12345.0f);
    views.push_back(d.view(p.n_head, p.layout.head_dim));
  }
  for (int ith = 0; ith < nth; ++ith) detail::attention_with(k, p, views, ith, nth);
}

TEST_P(AttentionTest, MatchesReferenceForAnyThreadCount) {
  const Case& c = GetParam();
  const Shape& sh = c.shape;
  AttentionParams p;
  p.layout = layout_of(sh);
  p.n_head = sh.n_head;
  p.scale = 1.0f / std::sqrt(static_cast<float>(sh.head_dim));
  p.window = c.window;
  p.softcap = c.softcap;

  std::vector<SeqData> data;
  for (size_t s = 0; s < c.seqs.size(); ++s) {
    data.push_back(make_seq(sh, c.seqs[s].first, c.seqs[s].second, static_cast<uint32_t>(100 + s)));
  }
  std::vector<std::vector<float>> want;
  std::vector<DenseKv> dense;
  std::vector<SeqData> ref_data;  // the queries the kernels score against (rounded for Q8_0)
  for (const auto& d : data) ref_data.push_back(with_q8_queries(sh, p, d));
  for (auto& d : ref_data) {
    dense.push_back(dense_kv(sh, d));
    AttentionSeq v = d.view(sh.n_head, sh.head_dim);
    std::vector<float> out(d.out.size());
    v.out = out.data();
    attention_ref(p, v);
    want.push_back(std::move(out));
  }

  for (const detail::AttentionKernels* k : kernel_tables()) {
    SCOPED_TRACE(std::string(k->isa));
    run_attention(*k, p, data, 1);
    const int depth = k->isa == "avx2" ? sh.head_dim / 8 + 3 : sh.head_dim;
    std::vector<std::vector<float>> one_thread;
    for (size_t s = 0; s < data.size(); ++s) {
      const SeqData& d = data[s];
      for (int i = 0; i < d.n_q; ++i) {
        for (int h = 0; h < sh.n_head; ++h) {
          // Soft-capping is 1-Lipschitz, so it does not grow the scores' errors; its own
          // vectorized tanh adds about cap x exp's relative error to each score, which moves
          // the output by at most twice that times the largest value.
          const double tol = row_tolerance(sh, p, ref_data[s], dense[s], i, h, depth) +
                             (p.softcap > 0.0f ? 2.0 * p.softcap * 1e-6 * max_abs_value(sh, dense[s], h) : 0.0);
          const size_t off = (static_cast<size_t>(i) * sh.n_head + h) * sh.head_dim;
          for (int c2 = 0; c2 < sh.head_dim; ++c2) {
            ASSERT_NEAR(d.out[off + c2], want[s][off + c2], tol)
                << "seq " << s << " query " << i << " head " << h << " dim " << c2;
          }
        }
      }
      one_thread.push_back(d.out);
    }
    for (int nth : {2, 3}) {
      run_attention(*k, p, data, nth);
      for (size_t s = 0; s < data.size(); ++s) {
        if (data[s].out.empty()) continue;
        ASSERT_EQ(0, std::memcmp(data[s].out.data(), one_thread[s].data(),
                                 one_thread[s].size() * sizeof(float)))
            << "nth " << nth << " differs from one thread, seq " << s;
      }
    }
  }
}

const Shape kSmol{9, 3, 64, 16, DType::kF16};

Shape with(Shape s, int block_size, DType type) {
  s.block_size = block_size;
  s.type = type;
  return s;
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, AttentionTest,
    ::testing::Values(
        Case{"decode_first_token_f16", kSmol, {{1, 0}}},
        Case{"decode_first_token_q8", with(kSmol, 16, DType::kQ8_0), {{1, 0}}},
        Case{"decode_bs16_f16", kSmol, {{1, 100}}},
        Case{"decode_bs32_f16", with(kSmol, 32, DType::kF16), {{1, 100}}},
        Case{"decode_bs5_f16", with(kSmol, 5, DType::kF16), {{1, 100}}},
        Case{"decode_bs16_q8", with(kSmol, 16, DType::kQ8_0), {{1, 100}}},
        Case{"decode_bs32_q8", with(kSmol, 32, DType::kQ8_0), {{1, 100}}},
        Case{"decode_bs5_q8", with(kSmol, 5, DType::kQ8_0), {{1, 100}}},
        Case{"q7_mha_hd128", Shape{8, 8, 128, 32, DType::kF16}, {{7, 0}}},
        Case{"q7_pos45_gqa4_q8", Shape{32, 8, 64, 5, DType::kQ8_0}, {{7, 45}}},
        Case{"q64_f16", kSmol, {{64, 0}}},
        Case{"q64_q8", with(kSmol, 16, DType::kQ8_0), {{64, 0}}},
        Case{"q64_pos33_gqa4_hd128", Shape{32, 8, 128, 32, DType::kF16}, {{64, 33}}},
        Case{"q200_f16", kSmol, {{200, 0}}},
        Case{"q200_pos57_bs5_q8", with(kSmol, 5, DType::kQ8_0), {{200, 57}}},
        Case{"q200_pos20_mha_hd128", Shape{8, 8, 128, 16, DType::kQ8_0}, {{200, 20}}},
        Case{"mixed_f16", kSmol, {{1, 300}, {7, 0}, {64, 20}, {1, 5}, {200, 10}}},
        Case{"mixed_q8", with(kSmol, 32, DType::kQ8_0), {{1, 300}, {7, 0}, {64, 20}, {1, 5}}},
        Case{"mixed_mha_hd128_q8", Shape{8, 8, 128, 32, DType::kQ8_0}, {{1, 40}, {7, 13}, {1, 0}}},
        Case{"mixed_gqa4_hd128_bs5", Shape{32, 8, 128, 5, DType::kF16}, {{64, 0}, {1, 77}, {7, 3}}},
        Case{"empty_seq_skipped", kSmol, {{0, 4}, {3, 2}}},
        Case{"bs1_f16", with(kSmol, 1, DType::kF16), {{7, 9}, {1, 3}}},
        Case{"hd256_q8", Shape{4, 2, 256, 16, DType::kQ8_0}, {{9, 40}}},
        Case{"hd80_mqa_f16", Shape{6, 1, 80, 16, DType::kF16}, {{5, 70}}},
        // Sliding windows: within one chunk, across chunk edges, wider than the context,
        // one key (a query sees only itself), decodes and long prefills mixed.
        Case{"window37_decode_f16", kSmol, {{1, 300}}, 37},
        Case{"window37_decode_q8", with(kSmol, 16, DType::kQ8_0), {{1, 300}}, 37},
        Case{"window32_decode_bs5_f16", with(kSmol, 5, DType::kF16), {{1, 95}}, 32},
        Case{"window1_f16", kSmol, {{9, 30}}, 1},
        Case{"window1_q8", with(kSmol, 16, DType::kQ8_0), {{9, 30}}, 1},
        Case{"window_wider_than_context_f16", kSmol, {{7, 20}}, 1000},
        Case{"window40_q200_f16", kSmol, {{200, 0}}, 40},
        Case{"window40_q200_pos57_bs5_q8", with(kSmol, 5, DType::kQ8_0), {{200, 57}}, 40},
        Case{"window7_q64_gqa4_hd128", Shape{32, 8, 128, 32, DType::kF16}, {{64, 33}}, 7},
        Case{"window100_mixed_f16", kSmol, {{1, 300}, {7, 0}, {64, 120}, {1, 5}, {200, 10}}, 100},
        Case{"window64_mixed_mha_hd128_q8", Shape{8, 8, 128, 32, DType::kQ8_0}, {{1, 400}, {70, 13}, {1, 0}}, 64},
        Case{"window512_hd256_mqa_q8", Shape{4, 1, 256, 16, DType::kQ8_0}, {{3, 700}, {40, 490}}, 512},
        // Soft-capped scores (gemma2), caps small enough to bind on these scores.
        Case{"softcap_decode_f16", kSmol, {{1, 100}}, 0, 0.5f},
        Case{"softcap_decode_q8", with(kSmol, 16, DType::kQ8_0), {{1, 100}}, 0, 0.5f},
        Case{"softcap_q64_gqa4_hd128", Shape{32, 8, 128, 32, DType::kF16}, {{64, 33}}, 0, 1.0f},
        Case{"softcap_window37_mixed_q8", with(kSmol, 5, DType::kQ8_0), {{1, 300}, {70, 13}, {200, 57}}, 37, 0.5f}),
    [](const ::testing::TestParamInfo<Case>& param_info) { return param_info.param.name; });

// The soft-capped cases above test something: with their cap the reference's outputs move
// far past the kernels' tolerance, so a kernel ignoring the cap fails them.
TEST(Attention, SoftCapMovesTheOutputsOfTheTestCases) {
  const Shape sh = with(kSmol, 16, DType::kQ8_0);
  SeqData d = make_seq(sh, 1, 100, 100);
  AttentionParams p = params_of(sh, 1.0f / std::sqrt(static_cast<float>(sh.head_dim)));
  AttentionSeq v = d.view(sh.n_head, sh.head_dim);
  std::vector<float> plain(d.out.size()), capped(d.out.size());
  v.out = plain.data();
  attention_ref(p, v);
  p.softcap = 0.5f;
  v.out = capped.data();
  attention_ref(p, v);
  double diff = 0.0;
  for (size_t i = 0; i < plain.size(); ++i) diff = std::max(diff, std::fabs(static_cast<double>(plain[i]) - capped[i]));
  EXPECT_GT(diff, 1e-3);
}

// A query must not see keys after its position: keys of later queries in the same step, or
// slots of the page never written. Changing them must not change a single bit.
TEST(Attention, KeysAfterAQueryHaveNoEffect) {
  for (const detail::AttentionKernels* k : kernel_tables()) {
    for (DType type : {DType::kF16, DType::kQ8_0}) {
      SCOPED_TRACE(std::string(k->isa) + " " + std::string(dtype_name(type)));
      const Shape sh{9, 3, 64, 16, type};
      const AttentionParams p = params_of(sh, 0.125f);
      std::vector<SeqData> data;
      data.push_back(make_seq(sh, 7, 20, 7));  // keys 0..26; slots 27..31 never written
      run_attention(*k, p, data, 1);
      const std::vector<float> before = data[0].out;

      // Overwrite the last query's own key and value (position 26) and the unwritten
      // slots with large finite garbage; queries 0..5 must be unchanged.
      std::vector<float> garbage(static_cast<size_t>(sh.n_head_kv) * sh.head_dim, 3.0e4f);
      for (int slot = 26 % 16; slot < 16; ++slot) {
        kv_store(p.layout, data[0].k_pages[1].data(), slot, garbage.data());
        kv_store(p.layout, data[0].v_pages[1].data(), slot, garbage.data());
      }
      run_attention(*k, p, data, 1);
      const size_t per_query = static_cast<size_t>(sh.n_head) * sh.head_dim;
      EXPECT_EQ(0, std::memcmp(before.data(), data[0].out.data(), 6 * per_query * sizeof(float)));
      // ... and the last query does see its own key.
      EXPECT_NE(0, std::memcmp(before.data() + 6 * per_query, data[0].out.data() + 6 * per_query,
                               per_query * sizeof(float)));
    }
  }
}

// With a window of w, query i sees keys [pos - w + 1, pos] only: keys before its window
// (in earlier chunks, or earlier in the chunk that holds its first key) change no bit of it,
// and its first key does change it.
TEST(Attention, KeysBeforeTheWindowHaveNoEffect) {
  for (const detail::AttentionKernels* k : kernel_tables()) {
    for (DType type : {DType::kF16, DType::kQ8_0}) {
      SCOPED_TRACE(std::string(k->isa) + " " + std::string(dtype_name(type)));
      const Shape sh{9, 3, 64, 16, type};
      const AttentionParams p = params_of(sh, 0.125f, 20);
      std::vector<SeqData> data;
      data.push_back(make_seq(sh, 9, 60, 13));  // queries at 60..68 see [41 + i, 60 + i]
      data.push_back(make_seq(sh, 1, 68, 13));  // the last query again, as a decode
      run_attention(*k, p, data, 1);
      const std::vector<float> before = data[0].out, before_decode = data[1].out;
      std::vector<float> garbage(static_cast<size_t>(sh.n_head_kv) * sh.head_dim, 3.0e4f);
      auto overwrite = [&](SeqData& d, int64_t pos) {
        kv_store(p.layout, d.k_pages[pos / 16].data(), static_cast<int>(pos % 16), garbage.data());
        kv_store(p.layout, d.v_pages[pos / 16].data(), static_cast<int>(pos % 16), garbage.data());
      };
      for (int64_t pos = 0; pos < 41; ++pos) {
        overwrite(data[0], pos);
        overwrite(data[1], pos);
      }
      run_attention(*k, p, data, 2);
      EXPECT_EQ(before, data[0].out);
      EXPECT_EQ(before_decode, data[1].out);
      overwrite(data[0], 41);  // query 0's first key; queries 1..8 start after it
      run_attention(*k, p, data, 1);
      const size_t per_query = static_cast<size_t>(sh.n_head) * sh.head_dim;
      EXPECT_NE(0, std::memcmp(before.data(), data[0].out.data(), per_query * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(before.data() + per_query, data[0].out.data() + per_query,
                               8 * per_query * sizeof(float)));
    }
  }
}

// A decode (one query) may run a kernel of its own, but it must give the bits the same
// query gets inside a multi-query step over the same pages: a prompt's last token, a
// recomputation after preemption and a decode all compute that row; with a window too.
TEST(Attention, ADecodeGivesTheBitsOfTheSameQueryInALongerStep) {
  const std::vector<Shape> shapes = {{9, 3, 64, 16, DType::kF16}, {8, 8, 128, 32, DType::kF16},
                                     {4, 2, 64, 5, DType::kF16},  {32, 8, 128, 16, DType::kF16},
                                     {9, 3, 64, 16, DType::kQ8_0}, {6, 1, 80, 16, DType::kF16},
                                     {4, 2, 128, 5, DType::kQ8_0}};
  for (const detail::AttentionKernels* k : kernel_tables()) {
    for (const Shape& sh : shapes) {
      for (int64_t window : {0, 45}) {
        SCOPED_TRACE(std::string(k->isa) + " " + std::string(dtype_name(sh.type)) + " heads " +
                     std::to_string(sh.n_head) + "/" + std::to_string(sh.n_head_kv) + " hd " +
                     std::to_string(sh.head_dim) + " window " + std::to_string(window));
        AttentionParams p;
        p.layout = layout_of(sh);
        p.n_head = sh.n_head;
        p.scale = 1.0f / std::sqrt(static_cast<float>(sh.head_dim));
        p.window = window;
        // Keys 0..100: chunks of 32 and a short one. 40 queries make tiles of many rows, 3 of
        // a few (Q8_0 keys are scored differently in each, to the same bits).
        for (const auto& [n_q, queries] : {std::pair{40, std::vector<int>{0, 2, 27, 39}},
                                           std::pair{3, std::vector<int>{0, 2}}}) {
          std::vector<SeqData> data;
          data.push_back(make_seq(sh, n_q, 101 - n_q, 11));
          run_attention(*k, p, data, 1);
          const size_t stride = static_cast<size_t>(sh.n_head) * sh.head_dim;
          for (int i : queries) {
            AttentionSeq one = data[0].view(sh.n_head, sh.head_dim);
            std::vector<float> out(stride, -12345.0f);
            one.n_q = 1;
            one.pos0 = data[0].pos0 + i;
            one.q = data[0].q.data() + static_cast<size_t>(i) * stride;
            one.out = out.data();
            for (int nth : {1, 2}) {
              for (int ith = 0; ith < nth; ++ith) {
                detail::attention_with(*k, p, std::span<const AttentionSeq>(&one, 1), ith, nth);
              }
              EXPECT_EQ(0, std::memcmp(out.data(), data[0].out.data() + static_cast<size_t>(i) * stride,
                                       stride * sizeof(float)))
                  << "query " << i << " of " << n_q << ", " << nth << " thread(s)";
            }
          }
        }
      }
    }
  }
}

TEST(Attention, RunsOnAThreadPool) {
  const Shape sh = kSmol;
  AttentionParams p;
  p.layout = layout_of(sh);
  p.n_head = sh.n_head;
  p.scale = 0.125f;
  std::vector<SeqData> data;
  data.push_back(make_seq(sh, 33, 40, 1));
  data.push_back(make_seq(sh, 1, 90, 2));
  std::vector<AttentionSeq> views;
  for (auto& d : data) views.push_back(d.view(sh.n_head, sh.head_dim));
  attention(p, views, 0, 1);
  const std::vector<float> serial0 = data[0].out, serial1 = data[1].out;
  ThreadPool pool(2);
  pool.run([&](int ith, int nth) { attention(p, views, ith, nth); });
  EXPECT_EQ(serial0, data[0].out);
  EXPECT_EQ(serial1, data[1].out);
}

TEST(AttentionDeathTest, RefusesHeadDimsPastTheScratchBound) {
  KvPageLayout lay;
  lay.type = DType::kF16;
  lay.block_size = 16;
  lay.n_head_kv = 1;
  lay.head_dim = 264;
  std::vector<uint8_t> page(lay.page_bytes());
  std::vector<float> row(264, 0.0f);
  EXPECT_DEATH(kv_store(lay, page.data(), 0, row.data()), "head_dim");
  AttentionParams p;
  p.layout = lay;
  p.n_head = 1;
  p.scale = 1.0f;
  EXPECT_DEATH(attention(p, {}, 0, 1), "head_dim");
}

TEST(Attention, TileRowsRespectTheScratchBounds) {
  for (int hd : {8, 64, 128, 256}) {
    for (int group : {1, 3, 4, 7, 8, 64, 200}) {
      const int rows = detail::attention_tile_rows(group, hd);
      EXPECT_GT(rows, 0);
      EXPECT_LE(rows, detail::kMaxTileRows);
      EXPECT_LE(rows * hd, detail::kMaxTileFloats);
      if (group <= rows) {
        EXPECT_EQ(rows % group, 0) << "tiles hold whole query groups";
      }
    }
  }
}

// F16 pages hold exactly fp32_to_fp16 of the input (the AVX2 F16C store included, over
// normals, subnormals, ties and infinities); Q8_0 pages exactly quantize_row_ref's bytes.
TEST(KvPages, StoreMatchesTheReferenceFormats) {
  const int hd = 64;
  std::vector<float> x(2 * hd);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (auto& v : x) v = unit(rng) * 100.0f;
  x[0] = 1e-6f;          // F16 subnormal
  x[1] = 6.1e-5f;        // near the smallest normal
  x[2] = 70000.0f;       // overflows to inf
  x[3] = 1.0f + 0x1p-11f;  // a tie: rounds to even
  x[4] = -0.0f;
  x[hd + 5] = 1.0f + 3 * 0x1p-11f;  // a tie that rounds up
  for (DType type : {DType::kF16, DType::kQ8_0}) {
    KvPageLayout lay;
    lay.type = type;
    lay.block_size = 5;
    lay.n_head_kv = 2;
    lay.head_dim = hd;
    std::vector<uint8_t> page(lay.page_bytes(), 0);
    kv_store(lay, page.data(), 3, x.data());
    std::vector<uint8_t> want(lay.row_bytes());
    std::vector<float> back(hd), want_back(hd);
    for (int h = 0; h < 2; ++h) {
      quantize_row_ref(type, x.data() + h * hd, want.data(), hd);
      const uint8_t* row = page.data() + h * lay.head_bytes() + 3 * lay.row_bytes();
      EXPECT_EQ(0, std::memcmp(row, want.data(), want.size())) << dtype_name(type) << " head " << h;
      kv_load(lay, page.data(), 3, h, back.data());
      dequantize_row_ref(type, want.data(), want_back.data(), hd);
      EXPECT_EQ(back, want_back);
    }
    // Other slots untouched.
    for (size_t i = 0; i < lay.row_bytes(); ++i) ASSERT_EQ(page[i], 0);
  }
}

}  // namespace
}  // namespace metro::kernels
