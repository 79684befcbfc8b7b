#include "backends/backend_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "backends/registry.h"
#include "base/thread_pool.h"

namespace metro::backends::testing {

Case make_case(std::string name, int n_tokens, int n_logits) {
  Case c;
  c.name = std::move(name);
  c.spec.max_tokens = n_tokens + 1;
  c.spec.max_logits = n_logits + 1;
  c.spec.max_seqs = 4;
  c.spec.max_blocks_per_seq = 64;
  for (int t = 0; t < n_tokens; ++t) {
    c.token.push_back(t);
    c.pos.push_back(t);
    c.seq.push_back(0);
  }
  c.runs.push_back({0, 0, n_tokens, 0});
  for (int r = 0; r < n_logits; ++r) c.logit_rows.push_back(r);
  return c;
}

ActId add_act(Case& c, int64_t cols, RowSet rows) {
  c.spec.acts.push_back({cols, rows});
  const int max_rows = rows == RowSet::kTokens ? c.spec.max_tokens : c.spec.max_logits;
  c.init.emplace_back(static_cast<size_t>(max_rows * cols), kPoison);
  return static_cast<ActId>(c.spec.acts.size() - 1);
}

void set_rows(Case& c, ActId act, const std::vector<float>& values) {
  auto& buf = c.init[static_cast<size_t>(act)];
  ASSERT_LE(values.size(), buf.size());
  std::copy(values.begin(), values.end(), buf.begin());
}

void count_products(Case& c, int n_products, const std::vector<kernels::DType>& types, int64_t widest_k) {
  c.spec.max_products = n_products;
  c.spec.product_types = types;
  c.spec.widest_product_k = widest_k;
}

Uploaded upload(Backend& b, const Case& c) {
  Uploaded up;
  for (const MatrixSrc& m : c.matrices) {
    HostMatrix h;
    h.type = m.type;
    h.n_rows = m.n_rows;
    h.n_cols = m.n_cols;
    h.data = m.bytes.data() + m.offset;
    h.row_stride = m.row_stride;
    up.matrices.push_back(b.upload_matrix(h, m.use, true));
  }
  for (const auto& v : c.vectors) up.vectors.push_back(b.upload_vector(v));
  if (c.kv) up.kv = b.alloc_buffer(c.kv->bytes.size());
  return up;
}

Outcome run(Backend& b, const Case& c, const Uploaded& up, int n_threads) {
  auto state = b.make_state(c.spec);
  for (size_t i = 0; i < c.init.size(); ++i) state->upload(static_cast<ActId>(i), c.init[i]);
  KvView view;
  std::vector<std::span<const int32_t>> tables;
  if (c.kv) {
    b.write_bytes(*up.kv, 0, c.kv->bytes);
    view.layout = c.kv->layout;
    view.n_layer = c.kv->n_layer;
    view.n_blocks = c.kv->n_blocks;
    view.arena = up.kv->data();
    for (const auto& t : c.kv->tables) tables.emplace_back(t);
    view.tables = tables;
  }
  StepDesc step;
  step.token = c.token;
  step.pos = c.pos;
  step.seq = c.seq;
  step.runs = c.runs;
  step.logit_rows = c.logit_rows;
  step.kv = c.kv ? &view : nullptr;
  step.adapter = c.adapter;
  const std::vector<Op> ops = c.ops(up);
  ThreadPool pool(n_threads);
  b.execute(ops, step, *state, pool);
  Outcome o;
  for (size_t i = 0; i < c.init.size(); ++i) {
    auto s = state->download(static_cast<ActId>(i), c.init[i].size());
    o.acts.emplace_back(s.begin(), s.end());
  }
  if (c.kv) {
    o.kv.resize(c.kv->bytes.size());
    b.read_bytes(*up.kv, 0, o.kv);
  }
  return o;
}

void expect_matches(const Case& c, const Outcome& o) {
  for (const Expect& e : c.expect) {
    const size_t a = static_cast<size_t>(e.act);
    const size_t cols = static_cast<size_t>(c.spec.acts[a].cols);
    const std::vector<float>& got = o.acts[a];
    ASSERT_EQ(e.want.size(), static_cast<size_t>(e.rows) * cols);
    ASSERT_EQ(e.tol.size(), e.want.size());
    for (size_t i = 0; i < e.want.size(); ++i) {
      ASSERT_LE(std::fabs(static_cast<double>(got[i]) - e.want[i]), e.tol[i])
          << "buffer " << a << " row " << i / cols << " col " << i % cols << ": got " << got[i]
          << ", want " << e.want[i];
    }
    for (size_t i = e.want.size(); i < got.size(); ++i) {
      ASSERT_EQ(0, std::memcmp(&got[i], &c.init[a][i], sizeof(float)))
          << "buffer " << a << " row " << i / cols << " was written past the op's rows";
    }
  }
  if (!c.want_kv.empty()) {
    ASSERT_EQ(o.kv.size(), c.want_kv.size());
    for (size_t i = 0; i < o.kv.size(); ++i) {
      ASSERT_EQ(o.kv[i], c.want_kv[i]) << "KV arena byte " << i;
    }
  }
}

void expect_same_bits(const Outcome& a, const Outcome& b, const std::string& what) {
  ASSERT_EQ(a.acts.size(), b.acts.size());
  for (size_t i = 0; i < a.acts.size(); ++i) {
    ASSERT_EQ(a.acts[i].size(), b.acts[i].size());
    EXPECT_EQ(0, std::memcmp(a.acts[i].data(), b.acts[i].data(), a.acts[i].size() * sizeof(float)))
        << what << ": buffer " << i;
  }
  EXPECT_EQ(a.kv, b.kv) << what << ": KV arena";
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const auto& b : available_backends()) names.emplace_back(b->name());
  return names;
}

std::shared_ptr<Backend> backend_named(const std::string& name) {
  for (auto& b : available_backends()) {
    if (b->name() == name) return b;
  }
  return nullptr;
}

std::vector<float> random_floats(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace metro::backends::testing
