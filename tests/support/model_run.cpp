#include "support/model_run.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "base/thread_pool.h"

namespace metro::testing {

Logits sequence_logits(const model::Model& m, const std::vector<int32_t>& toks, int chunk, int threads,
                       int block_size, int n_ctx, int16_t adapter) {
  ThreadPool pool(threads);
  model::WorkspaceLimits lim;
  lim.max_tokens = chunk;
  lim.max_logits = chunk;
  lim.max_seqs = 4;
  lim.max_blocks_per_seq = static_cast<int>(toks.size()) / block_size + 2;
  lim.n_ctx = n_ctx;
  model::Workspace ws = m.make_workspace(lim);
  model::SequenceKv kv(m, static_cast<int>(toks.size()), kernels::DType::kF16, block_size);
  Logits out;
  for (size_t s = 0; s < toks.size(); s += static_cast<size_t>(chunk)) {
    model::Batch b;
    for (size_t i = s; i < std::min(toks.size(), s + static_cast<size_t>(chunk)); ++i) {
      b.add(toks[i], static_cast<int32_t>(i), 0, true, adapter);
    }
    if (!forward_rows(m, b, kv.view(), ws, pool, out)) return out;
  }
  return out;
}

bool forward_rows(const model::Model& m, const model::Batch& b, const model::KvView& kv, model::Workspace& ws,
                  ThreadPool& pool, Logits& out) {
  auto r = m.forward(b, kv, ws, pool);
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (!r.ok()) return false;
  for (int row = 0; row < r->n_rows; ++row) {
    auto v = r->row(row);
    out.emplace_back(v.begin(), v.end());
  }
  return true;
}

double max_abs_diff(const Logits& a, const Logits& b) {
  double worst = 0;
  for (size_t t = 0; t < std::min(a.size(), b.size()); ++t) {
    for (size_t i = 0; i < std::min(a[t].size(), b[t].size()); ++i) {
      const double d = std::fabs(static_cast<double>(a[t][i]) - b[t][i]);
      if (std::isnan(d)) return d;  // NaN compares false: never hide it
      worst = std::max(worst, d);
    }
  }
  return worst;
}

namespace {

std::vector<float> normalized(std::vector<double> v) {
  double n = 0.0;
  for (double x : v) n += x * x;
  n = std::sqrt(n);
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(v[i] / n);
  return out;
}

}  // namespace

std::vector<std::vector<float>> mean_pooled_embeddings(const model::Model& m,
                                                       const std::vector<std::vector<int32_t>>& seqs) {
  ThreadPool pool(2);
  int total = 0;
  for (const auto& s : seqs) total += static_cast<int>(s.size());
  model::WorkspaceLimits lim;
  lim.max_tokens = total;
  lim.max_logits = 1;
  lim.max_seqs = static_cast<int>(seqs.size());
  lim.max_blocks_per_seq = 64;
  model::Workspace ws = m.make_workspace(lim);
  // An encoder keeps no KV: each sequence's table only has to cover its positions.
  model::KvView kv;
  kv.layout = m.kv_layout(kernels::DType::kF16, 16);
  kv.n_layer = m.kv_layers();
  kv.n_blocks = 64;
  std::vector<int32_t> table(64);
  for (int i = 0; i < 64; ++i) table[static_cast<size_t>(i)] = i;
  model::Batch b;
  for (size_t s = 0; s < seqs.size(); ++s) {
    kv.tables.emplace_back(table);
    for (size_t i = 0; i < seqs[s].size(); ++i) b.add(seqs[s][i], static_cast<int32_t>(i), static_cast<int32_t>(s), false);
  }
  model::ForwardOptions fo;
  fo.want_hidden = true;
  auto out = m.forward(b, kv, ws, pool, fo);
  EXPECT_TRUE(out.ok()) << out.status().message();
  std::vector<std::vector<float>> result;
  if (!out.ok()) return result;
  const int n_embd = static_cast<int>(m.hparams().n_embd);
  int t = 0;
  for (const auto& s : seqs) {
    std::vector<double> sum(static_cast<size_t>(n_embd), 0.0);
    for (size_t i = 0; i < s.size(); ++i, ++t) {
      const float* h = out->hidden_row(t, n_embd);
      for (int d = 0; d < n_embd; ++d) sum[static_cast<size_t>(d)] += h[d];
    }
    result.push_back(normalized(std::move(sum)));
  }
  return result;
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double dot = 0.0, na = 0.0, nb = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    na += static_cast<double>(a[i]) * a[i];
    nb += static_cast<double>(b[i]) * b[i];
  }
  return dot / std::sqrt(na * nb);
}


}  // namespace metro::testing
