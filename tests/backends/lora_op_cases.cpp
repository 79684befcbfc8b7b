#include "backends/lora_op_cases.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

namespace metro::backends::testing {

namespace {

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

struct LoraShape {
  std::string name;
  RowSet rows;
  int n_rows;                       // token rows, or logits rows
  int64_t k;                        // input width
  std::vector<int64_t> n_out;       // each output's width
  std::vector<int16_t> adapter;     // per token
  // ranks[j][a]: output j's rank for adapter a + 1 (0: the adapter leaves it alone)
  std::vector<std::vector<int64_t>> ranks;
};

// dst_j[r] + B (A x): A x within (k + 2) u of its magnitude per value, B times it within
// (rank + 2) u of that product's magnitude plus B's magnitudes times A x's errors, then one
// correctly rounded sum; we allow twice the total.
Case lora_case(const LoraShape& s, uint32_t seed) {
  const bool logits = s.rows == RowSet::kLogits;
  const int n_tokens = static_cast<int>(s.adapter.size());
  Case c = make_case("lora " + s.name, n_tokens, logits ? s.n_rows : 0);
  if (logits) {
    c.logit_rows.clear();
    for (int r = 0; r < s.n_rows; ++r) c.logit_rows.push_back((r * 3 + 1) % n_tokens);
  }
  c.adapter = s.adapter;
  const int n_adapters = static_cast<int>(s.ranks[0].size());
  int64_t max_rank = 0, out_sum = 0;
  for (const auto& r : s.ranks) max_rank = std::max(max_rank, *std::max_element(r.begin(), r.end()));
  for (int64_t n : s.n_out) out_sum += n;
  const ActId src = add_act(c, s.k, s.rows);
  const auto x = random_floats(static_cast<size_t>(s.n_rows * s.k), -2.0f, 2.0f, seed++);
  set_rows(c, src, x);
  std::vector<ActId> dst;
  std::vector<std::vector<float>> dst0;
  for (int64_t n : s.n_out) {
    dst.push_back(add_act(c, n, s.rows));
    dst0.push_back(random_floats(static_cast<size_t>(s.n_rows * n), -1.0f, 1.0f, seed++));
    set_rows(c, dst.back(), dst0.back());
  }
  const ActId in = add_act(c, s.k, s.rows), mid = add_act(c, 3 * max_rank, s.rows), out = add_act(c, out_sum, s.rows);
  // Factors: matrices[2 (j * n_adapters + a)] is A, the next one B.
  std::vector<std::vector<float>> fa, fb;
  for (size_t j = 0; j < s.n_out.size(); ++j) {
    for (int a = 0; a < n_adapters; ++a) {
      const int64_t r = std::max<int64_t>(1, s.ranks[j][static_cast<size_t>(a)]);
      fa.push_back(random_floats(static_cast<size_t>(r * s.k), -0.5f, 0.5f, seed++));
      fb.push_back(random_floats(static_cast<size_t>(s.n_out[j] * r), -0.5f, 0.5f, seed++));
      c.matrices.push_back({kernels::DType::kF32, r, s.k, f32_bytes(fa.back()), static_cast<size_t>(s.k) * 4, 0,
                            MatrixUse::kProduct});
      c.matrices.push_back({kernels::DType::kF32, s.n_out[j], r, f32_bytes(fb.back()), static_cast<size_t>(r) * 4, 0,
                            MatrixUse::kProduct});
    }
  }
  c.spec.max_adapters = n_adapters;
  auto sets = std::make_shared<std::vector<LoraSet>>(s.n_out.size());
  c.ops = [=](const Uploaded& up) {
    LoraOp op{src, s.rows, static_cast<int>(s.n_out.size()), {}, {}, in, mid, out};
    for (size_t j = 0; j < s.n_out.size(); ++j) {
      LoraSet& set = (*sets)[j];
      set.a.assign(static_cast<size_t>(n_adapters), nullptr);
      set.b.assign(static_cast<size_t>(n_adapters), nullptr);
      for (int a = 0; a < n_adapters; ++a) {
        if (s.ranks[j][static_cast<size_t>(a)] == 0) continue;
        const size_t m = 2 * (j * static_cast<size_t>(n_adapters) + static_cast<size_t>(a));
        set.a[static_cast<size_t>(a)] = up.matrices[m].get();
        set.b[static_cast<size_t>(a)] = up.matrices[m + 1].get();
      }
      op.sets[j] = &set;
      op.dst[j] = dst[j];
    }
    return std::vector<Op>{op};
  };
  for (size_t j = 0; j < s.n_out.size(); ++j) {
    const int64_t n = s.n_out[j];
    Expect e{dst[j], s.n_rows, {}, {}};
    for (int r = 0; r < s.n_rows; ++r) {
      const int tok = logits ? c.logit_rows[static_cast<size_t>(r)] : r;
      const int a = s.adapter[static_cast<size_t>(tok)];
      const int64_t rank = a == 0 ? 0 : s.ranks[j][static_cast<size_t>(a - 1)];
      std::vector<double> v(static_cast<size_t>(rank)), v_err(static_cast<size_t>(rank));
      const float* xr = x.data() + static_cast<size_t>(r) * static_cast<size_t>(s.k);
      for (int64_t q = 0; q < rank; ++q) {
        const float* ar = fa[j * static_cast<size_t>(n_adapters) + static_cast<size_t>(a - 1)].data() + q * s.k;
        double sum = 0, mag = 0;
        for (int64_t i = 0; i < s.k; ++i) {
          sum += static_cast<double>(ar[i]) * xr[i];
          mag += std::fabs(static_cast<double>(ar[i]) * xr[i]);
        }
        v[static_cast<size_t>(q)] = sum;
        v_err[static_cast<size_t>(q)] = (static_cast<double>(s.k) + 2) * kU * mag;
      }
      for (int64_t o = 0; o < n; ++o) {
        double y = 0, err = 0, mag = 0;
        if (rank > 0) {
          const float* br = fb[j * static_cast<size_t>(n_adapters) + static_cast<size_t>(a - 1)].data() + o * rank;
          for (int64_t q = 0; q < rank; ++q) {
            y += static_cast<double>(br[q]) * v[static_cast<size_t>(q)];
            err += std::fabs(br[q]) * v_err[static_cast<size_t>(q)];
            mag += std::fabs(br[q] * v[static_cast<size_t>(q)]);
          }
        }
        const double base = dst0[j][static_cast<size_t>(r * n + o)];
        e.want.push_back(base + y);
        e.tol.push_back(rank == 0 ? 0.0 : 2 * (err + (static_cast<double>(rank) + 2) * kU * mag + kU * std::fabs(base + y)) + 1e-30);
      }
    }
    c.expect.push_back(std::move(e));
  }
  return c;
}

}  // namespace

// Two adapters of ranks 4 and 16 on q-, k- and v-like outputs (k left alone by the first),
// tokens of both and of none in one step; a wide head over logits rows; an adapter with no
// token in the step.
std::vector<Case> lora_cases() {
  std::vector<Case> cases;
  uint32_t seed = 1200;
  cases.push_back(lora_case({"qkv", RowSet::kTokens, 7, 96, {64, 32, 32}, {1, 0, 2, 2, 1, 0, 1},
                             {{4, 16}, {0, 16}, {4, 8}}},
                            seed));
  cases.push_back(lora_case({"one output, many rows", RowSet::kTokens, 70, 64, {48}, std::vector<int16_t>(70, 2),
                             {{8, 3}}},
                            seed += 100));
  cases.push_back(lora_case({"head over logits rows", RowSet::kLogits, 4, 64, {300}, {0, 1, 3, 1, 3, 0},
                             {{8, 0, 5}}},
                            seed += 100));
  return cases;
}

}  // namespace metro::backends::testing
