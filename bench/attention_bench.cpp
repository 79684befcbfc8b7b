// Paged attention on SmolLM2-135M's shape (9 query heads, 3 KV heads, head_dim 64, F16
// pages of 16 tokens, scattered through an arena like a block pool's).
//
// Decode: one query token attending to its whole context in each of 30 layers, so the KV
// of all layers (6 MiB per layer at context 8192) streams from memory as in a real step;
// reported as GB/s of K and V read. Batched decode: 16 sequences at once. Prefill: a
// 512-token chunk of one sequence, causal, reported in GFLOP/s (4 head_dim FLOPs per
// visible (query head, key) pair: QK and PV).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "base/aligned.h"
#include "base/check.h"
#include "base/thread_pool.h"
#include "kernels/attention.h"

namespace metro::kernels {
namespace {

constexpr int kHeads = 9;
constexpr int kKvHeads = 3;
constexpr int kHeadDim = 64;
constexpr int kLayers = 30;

KvPageLayout smol_layout(DType type) {
  KvPageLayout l;
  l.type = type;
  l.block_size = 16;
  l.n_head_kv = kKvHeads;
  l.head_dim = kHeadDim;
  return l;
}

// n_seqs sequences of `context` stored keys each, in `layers` layers; pages shuffled.
struct KvFixture {
  KvPageLayout layout;
  AlignedBuffer<uint8_t> arena;
  std::vector<std::vector<const uint8_t*>> k_pages, v_pages;  // [layer * n_seqs + s]
  std::vector<float> q, out;

  KvFixture(DType type, int n_seqs, int64_t context, int layers, int n_q) : layout(smol_layout(type)) {
    const int64_t pages_per_seq = (context + layout.block_size - 1) / layout.block_size;
    const int64_t n_pages = 2 * pages_per_seq * n_seqs * layers;
    arena.resize(static_cast<size_t>(n_pages) * layout.page_bytes());
    std::vector<int64_t> order(static_cast<size_t>(n_pages));
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 rng(1);
    std::shuffle(order.begin(), order.end(), rng);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    std::vector<float> row(static_cast<size_t>(kKvHeads) * kHeadDim);
    size_t next = 0;
    for (int l = 0; l < layers * n_seqs; ++l) {
      for (auto* pages : {&k_pages, &v_pages}) {
        pages->emplace_back();
        for (int64_t b = 0; b < pages_per_seq; ++b) {
          uint8_t* page = arena.data() + static_cast<size_t>(order[next++]) * layout.page_bytes();
          for (int slot = 0; slot < layout.block_size; ++slot) {
            for (auto& x : row) x = unit(rng);
            kv_store(layout, page, slot, row.data());
          }
          pages->back().push_back(page);
        }
      }
    }
    q.resize(static_cast<size_t>(n_seqs) * n_q * kHeads * kHeadDim);
    for (auto& x : q) x = unit(rng);
    out.resize(q.size());
  }

  std::vector<AttentionSeq> seqs(int layer, int n_seqs, int n_q, int64_t pos0) {
    std::vector<AttentionSeq> v;
    for (int s = 0; s < n_seqs; ++s) {
      AttentionSeq a;
      const size_t off = static_cast<size_t>(s) * n_q * kHeads * kHeadDim;
      a.q = q.data() + off;
      a.out = out.data() + off;
      a.n_q = n_q;
      a.pos0 = pos0;
      a.k_pages = k_pages[static_cast<size_t>(layer * n_seqs + s)].data();
      a.v_pages = v_pages[static_cast<size_t>(layer * n_seqs + s)].data();
      a.q_stride = kHeads * kHeadDim;
      a.out_stride = kHeads * kHeadDim;
      v.push_back(a);
    }
    return v;
  }
};

AttentionParams smol_params(DType type) {
  AttentionParams p;
  p.layout = smol_layout(type);
  p.n_head = kHeads;
  p.scale = 0.125f;
  return p;
}

void run(ThreadPool* pool, const AttentionParams& p, std::span<const AttentionSeq> seqs) {
  if (pool) {
    pool->run([&](int ith, int nth) { attention(p, seqs, ith, nth); });
  } else {
    attention(p, seqs, 0, 1);
  }
}

// Args: context, threads, type (0 F16, 1 Q8_0), sequences.
void BM_attention_decode(benchmark::State& state) {
  const int64_t context = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const DType type = state.range(2) ? DType::kQ8_0 : DType::kF16;
  const int n_seqs = static_cast<int>(state.range(3));
  KvFixture fx(type, n_seqs, context, kLayers, 1);
  const AttentionParams p = smol_params(type);
  std::vector<std::vector<AttentionSeq>> layers;
  for (int l = 0; l < kLayers; ++l) layers.push_back(fx.seqs(l, n_seqs, 1, context - 1));
  std::unique_ptr<ThreadPool> pool = threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
  for (auto _ : state) {
    for (const auto& seqs : layers) run(pool.get(), p, seqs);
    benchmark::ClobberMemory();
  }
  const double kv_bytes = 2.0 * static_cast<double>(context) * kKvHeads *
                          static_cast<double>(p.layout.row_bytes()) * n_seqs * kLayers;
  state.SetBytesProcessed(static_cast<int64_t>(kv_bytes * static_cast<double>(state.iterations())));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(n_seqs) * static_cast<double>(state.iterations()),
                                                  benchmark::Counter::kIsRate);
}

// The physical limit decode runs against, measured in the same process and conditions:
// reading exactly the K and V bytes decode reads (each KV head's rows of every page of
// every layer), summed so the reads cannot be skipped. Args as BM_attention_decode.
void BM_kv_read_baseline(benchmark::State& state) {
  const int64_t context = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const DType type = state.range(2) ? DType::kQ8_0 : DType::kF16;
  const int n_seqs = static_cast<int>(state.range(3));
  KvFixture fx(type, n_seqs, context, kLayers, 1);
  const KvPageLayout& lay = fx.layout;
  const size_t page_words = lay.page_bytes() / sizeof(uint64_t);
  const int64_t full_pages = context / lay.block_size;
  METRO_CHECK(context % lay.block_size == 0 && lay.page_bytes() % sizeof(uint64_t) == 0);
  std::unique_ptr<ThreadPool> pool = threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
  std::vector<uint64_t> sums(static_cast<size_t>(threads) * 8, 0);
  auto read_share = [&](int ith, int nth) {
    uint64_t sum = 0;
    const size_t n_lists = fx.k_pages.size();
    for (size_t li = 0; li < n_lists; ++li) {
      for (auto* lists : {&fx.k_pages, &fx.v_pages}) {
        const auto& pages = (*lists)[li];
        for (int64_t b = ith; b < full_pages; b += nth) {
          const auto* w = reinterpret_cast<const uint64_t*>(pages[static_cast<size_t>(b)]);
          for (size_t i = 0; i < page_words; ++i) sum += w[i];
        }
      }
    }
    sums[static_cast<size_t>(ith) * 8] += sum;
  };
  for (auto _ : state) {
    if (pool) {
      pool->run([&](int ith, int nth) { read_share(ith, nth); });
    } else {
      read_share(0, 1);
    }
    benchmark::DoNotOptimize(sums.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(2.0 * static_cast<double>(full_pages) *
                                               static_cast<double>(lay.page_bytes()) * n_seqs *
                                               kLayers * static_cast<double>(state.iterations())));
}

// Args: chunk length, threads, type.
void BM_attention_prefill(benchmark::State& state) {
  const int n_q = static_cast<int>(state.range(0));
  const int threads = static_cast<int>(state.range(1));
  const DType type = state.range(2) ? DType::kQ8_0 : DType::kF16;
  KvFixture fx(type, 1, n_q, 1, n_q);
  const AttentionParams p = smol_params(type);
  const auto seqs = fx.seqs(0, 1, n_q, 0);
  std::unique_ptr<ThreadPool> pool = threads > 1 ? std::make_unique<ThreadPool>(threads) : nullptr;
  for (auto _ : state) {
    run(pool.get(), p, seqs);
    benchmark::ClobberMemory();
  }
  const double pairs = static_cast<double>(kHeads) * n_q * (n_q + 1) / 2.0;
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * kHeadDim * pairs * static_cast<double>(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
}

BENCHMARK(BM_attention_decode)
    ->ArgNames({"ctx", "threads", "q8", "seqs"})
    ->ArgsProduct({{128, 512, 2048, 8192}, {1, 2}, {0, 1}, {1}})
    ->Args({512, 1, 0, 16})
    ->Args({512, 2, 0, 16})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_kv_read_baseline)
    ->ArgNames({"ctx", "threads", "q8", "seqs"})
    ->ArgsProduct({{128, 512, 2048, 8192}, {1, 2}, {0}, {1}})
    ->Args({512, 1, 0, 16})
    ->Args({512, 2, 0, 16})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_attention_prefill)
    ->ArgNames({"n_q", "threads", "q8"})
    ->ArgsProduct({{512}, {1, 2}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace metro::kernels
