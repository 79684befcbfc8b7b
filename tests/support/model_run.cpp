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

}  // namespace metro::testing
