#include "backends/moe_op_cases.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/kernel_test_util.h"
#include "kernels/ops.h"
#include "kernels/quant_ref.h"

namespace metro::backends::testing {

namespace {

namespace kt = metro::kernels::testing;
using kernels::DType;

struct MoeShape {
  DType gate_up, down;
  int64_t n_in, n_ff;
  int n_exp, n_used, n_tokens;
  ExpertGating gating;
  bool norm;
};

// A value and a bound on its distance from the exact one.
struct Bounded {
  double v = 0, err = 0;
};

// Row r's product with every row of a [n][k] matrix of type t, on activations quantized
// to t's dot partner by the reference quantizer (what a backend computes), with the bound
// of project's cases (backend_ops_test.cpp): (n_terms + 8) u of the magnitude, doubled.
std::vector<Bounded> product(DType t, const std::vector<uint8_t>& w, int64_t n, int64_t k, const std::vector<float>& x) {
  const DType partner = kernels::traits(t).dot_partner;
  const double n_terms = static_cast<double>(partner == DType::kF32 ? k : k / kernels::traits(partner).block_size);
  const auto a = kt::quantize(partner, x);
  const size_t rb = kernels::row_bytes(t, k);
  std::vector<Bounded> y(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* row = w.data() + static_cast<size_t>(j) * rb;
    y[static_cast<size_t>(j)] = {kernels::vec_dot_ref(t, row, a.data(), k),
                                 2 * (n_terms + 8) * kU * kernels::vec_dot_magnitude_ref(t, row, a.data(), k)};
  }
  return y;
}

// The down product of hidden values h (each within its err of the exact one) that a
// backend computes from its own float h quantized to the partner: the exact product of the
// exact h (dequantized weights, double), off by the weights' magnitudes times each value's
// error and its quantization error (roundtrip_error_bound of its block's max), plus the
// product's rounding.
std::vector<Bounded> down_product(DType t, const std::vector<uint8_t>& w, int64_t n, int64_t k,
                                  const std::vector<Bounded>& h) {
  const DType partner = kernels::traits(t).dot_partner;
  const int64_t qb = partner == DType::kF32 ? 1 : kernels::traits(partner).block_size;
  const double rt = partner == DType::kF32 ? 0.0 : kernels::roundtrip_error_bound(partner);
  std::vector<double> h_err(static_cast<size_t>(k));
  for (int64_t b = 0; b < k; b += qb) {
    double mx = 0;
    for (int64_t i = b; i < b + qb; ++i) mx = std::max(mx, std::fabs(h[static_cast<size_t>(i)].v) + h[static_cast<size_t>(i)].err);
    for (int64_t i = b; i < b + qb; ++i) h_err[static_cast<size_t>(i)] = h[static_cast<size_t>(i)].err + rt * mx * 1.01;
  }
  const double n_terms = static_cast<double>(partner == DType::kF32 ? k : k / qb);
  const auto dense = kt::dequantize(t, w, n * k);
  std::vector<Bounded> y(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    double s = 0, err = 0, mag = 0;
    for (int64_t i = 0; i < k; ++i) {
      const double wv = dense[static_cast<size_t>(j * k + i)];
      s += wv * h[static_cast<size_t>(i)].v;
      err += std::fabs(wv) * h_err[static_cast<size_t>(i)];
      mag += std::fabs(wv) * (std::fabs(h[static_cast<size_t>(i)].v) + h_err[static_cast<size_t>(i)]);
    }
    y[static_cast<size_t>(j)] = {s, err + 2 * (n_terms + 8) * kU * mag};
  }
  return y;
}

// Router scores a unit or more apart (a shuffled ramp), so no rounding can reorder them.
std::vector<float> router_scores(int n_tokens, int n_exp, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> s;
  for (int t = 0; t < n_tokens; ++t) {
    std::vector<int> order(static_cast<size_t>(n_exp));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int e = 0; e < n_exp; ++e) s.push_back(-2.0f + 1.0f * static_cast<float>(order[static_cast<size_t>(e)]));
  }
  return s;
}

Case moe_case(const MoeShape& s, uint32_t seed) {
  const std::string name = "moe " + std::string(kernels::dtype_name(s.gate_up)) + "/" +
                           std::string(kernels::dtype_name(s.down)) + " " + std::to_string(s.n_used) + " of " +
                           std::to_string(s.n_exp) + " T=" + std::to_string(s.n_tokens) +
                           (s.gating == ExpertGating::kSigmoid ? " sigmoid" : " softmax") + (s.norm ? " norm" : "");
  Case c = make_case(name, s.n_tokens);
  const int T = s.n_tokens, k = s.n_used;
  const ActId src = add_act(c, s.n_in), router = add_act(c, s.n_exp), dst = add_act(c, s.n_in);
  const ActId in = add_act(c, k * s.n_in), gate = add_act(c, k * s.n_ff), up = add_act(c, k * s.n_ff),
              out = add_act(c, k * s.n_in);
  const auto x = kt::make_data(kt::Dist::kNormal, T * s.n_in, seed);
  set_rows(c, src, x);
  const auto scores = router_scores(T, s.n_exp, seed + 1);
  set_rows(c, router, scores);
  std::vector<std::vector<uint8_t>> wg, wu, wd;
  for (int e = 0; e < s.n_exp; ++e) {
    const uint32_t es = seed + 10 + 3 * static_cast<uint32_t>(e);
    wg.push_back(kt::quantize(s.gate_up, kt::make_data(kt::Dist::kNormal, s.n_ff * s.n_in, es)));
    wu.push_back(kt::quantize(s.gate_up, kt::make_data(kt::Dist::kNormal, s.n_ff * s.n_in, es + 1)));
    wd.push_back(kt::quantize(s.down, kt::make_data(kt::Dist::kNormal, s.n_in * s.n_ff, es + 2)));
  }
  for (int e = 0; e < s.n_exp; ++e) {
    c.matrices.push_back({s.gate_up, s.n_ff, s.n_in, wg[static_cast<size_t>(e)], kernels::row_bytes(s.gate_up, s.n_in), 0,
                          MatrixUse::kProduct});
    c.matrices.push_back({s.gate_up, s.n_ff, s.n_in, wu[static_cast<size_t>(e)], kernels::row_bytes(s.gate_up, s.n_in), 0,
                          MatrixUse::kProduct});
    c.matrices.push_back({s.down, s.n_in, s.n_ff, wd[static_cast<size_t>(e)], kernels::row_bytes(s.down, s.n_ff), 0,
                          MatrixUse::kProduct});
  }
  count_products(c, 0, {s.gate_up, s.down}, std::max(s.n_in, s.n_ff));
  c.spec.max_experts = s.n_exp;
  c.spec.max_experts_used = k;
  // The op points at its expert set: one per case, kept alive by the closure.
  auto set = std::make_shared<ExpertSet>();
  c.ops = [=](const Uploaded& upl) {
    set->gate.clear();
    set->up.clear();
    set->down.clear();
    for (int e = 0; e < s.n_exp; ++e) {
      set->gate.push_back(upl.matrices[static_cast<size_t>(3 * e)].get());
      set->up.push_back(upl.matrices[static_cast<size_t>(3 * e + 1)].get());
      set->down.push_back(upl.matrices[static_cast<size_t>(3 * e + 2)].get());
    }
    return std::vector<Op>{MoeOp{src, router, dst, set.get(), k, s.norm, s.gating, in, gate, up, out}};
  };

  Expect ex{dst, T, {}, {}};
  for (int t = 0; t < T; ++t) {
    // Probabilities in double; the float ones are within a few u (exp to kExpMaxRelError,
    // a sum of n_exp terms, a division).
    std::vector<double> p(static_cast<size_t>(s.n_exp));
    const float* sc = scores.data() + static_cast<size_t>(t * s.n_exp);
    if (s.gating == ExpertGating::kSoftmax) {
      const double mx = *std::max_element(sc, sc + s.n_exp);
      double z = 0;
      for (int e = 0; e < s.n_exp; ++e) z += (p[static_cast<size_t>(e)] = std::exp(sc[e] - mx));
      for (double& v : p) v /= z;
    } else {
      for (int e = 0; e < s.n_exp; ++e) p[static_cast<size_t>(e)] = 1.0 / (1.0 + std::exp(-static_cast<double>(sc[e])));
    }
    std::vector<int> order(static_cast<size_t>(s.n_exp));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)]; });
    double total = 0;
    for (int j = 0; j < k; ++j) total += p[static_cast<size_t>(order[static_cast<size_t>(j)])];
    const double w_rel = (4.0 * s.n_exp + 16) * (kernels::kExpMaxRelError + kU);
    const std::vector<float> xt(x.begin() + t * s.n_in, x.begin() + (t + 1) * s.n_in);
    std::vector<double> want(static_cast<size_t>(s.n_in), 0.0), tol(static_cast<size_t>(s.n_in), 0.0);
    for (int j = 0; j < k; ++j) {
      const int e = order[static_cast<size_t>(j)];
      const double w = p[static_cast<size_t>(e)] / (s.norm ? total : 1.0);
      const auto g = product(s.gate_up, wg[static_cast<size_t>(e)], s.n_ff, s.n_in, xt);
      const auto u = product(s.gate_up, wu[static_cast<size_t>(e)], s.n_ff, s.n_in, xt);
      std::vector<Bounded> h(static_cast<size_t>(s.n_ff));
      for (size_t i = 0; i < h.size(); ++i) {
        // silu(g) u: silu's slope is within [-0.1, 1.1]; silu itself within exp's error.
        const double sg = g[i].v / (1.0 + std::exp(-g[i].v));
        h[i].v = sg * u[i].v;
        h[i].err = 1.1 * g[i].err * (std::fabs(u[i].v) + u[i].err) + std::fabs(sg) * u[i].err +
                   (kernels::kExpMaxRelError + 4 * kU) * std::fabs(h[i].v) + 1e-30;
      }
      const auto d = down_product(s.down, wd[static_cast<size_t>(e)], s.n_in, s.n_ff, h);
      for (size_t i = 0; i < want.size(); ++i) {
        want[i] += w * d[i].v;
        tol[i] += w * d[i].err + (w_rel + 2 * k * kU) * w * (std::fabs(d[i].v) + d[i].err);
      }
    }
    ex.want.insert(ex.want.end(), want.begin(), want.end());
    ex.tol.insert(ex.tol.end(), tol.begin(), tol.end());
  }
  c.expect.push_back(std::move(ex));
  return c;
}

}  // namespace

// Tokens routed by scores a unit apart; every expert's products on the reference
// quantizer's activations, the hidden values' own errors and their quantization carried to
// the down product (down_product), the weights within a few u. T = 70 gives each expert
// many rows (the backend's GEMM path), T = 3 a few (GEMV); one expert of 6 may get none.
std::vector<Case> moe_cases() {
  std::vector<Case> cases;
  uint32_t seed = 400;
  const MoeShape shapes[] = {
      {DType::kF16, DType::kF16, 64, 32, 4, 2, 5, ExpertGating::kSoftmax, true},
      {DType::kQ8_0, DType::kQ8_0, 128, 64, 6, 2, 3, ExpertGating::kSoftmax, false},
      {DType::kQ4_0, DType::kQ4_1, 128, 96, 6, 3, 70, ExpertGating::kSoftmax, true},
      {DType::kQ4_K, DType::kQ6_K, 256, 256, 8, 2, 9, ExpertGating::kSigmoid, true},
      {DType::kQ4_1, DType::kQ8_0, 64, 64, 5, 5, 4, ExpertGating::kSigmoid, false},
  };
  for (const MoeShape& s : shapes) cases.push_back(moe_case(s, seed += 100));
  return cases;
}

// x + sigmoid(gate_in · g) y: the dot within n u of its magnitude, the sigmoid's slope at
// most 1/4, exp within kExpMaxRelError, then a product and a sum; without a gate, one
// correctly rounded sum.
std::vector<Case> gated_add_cases() {
  std::vector<Case> cases;
  uint32_t seed = 900;
  for (bool gated : {true, false}) {
    for (int64_t n : {64, 896}) {
      const int T = 4;
      Case c = make_case(std::string("gated_add n=") + std::to_string(n) + (gated ? "" : " ungated"), T);
      const ActId x = add_act(c, n), y = add_act(c, n), gin = add_act(c, n);
      const auto xv = random_floats(static_cast<size_t>(T * n), -3.0f, 3.0f, seed++);
      const auto yv = random_floats(static_cast<size_t>(T * n), -3.0f, 3.0f, seed++);
      const auto gv = random_floats(static_cast<size_t>(T * n), -1.0f, 1.0f, seed++);
      set_rows(c, x, xv);
      set_rows(c, y, yv);
      set_rows(c, gin, gv);
      c.vectors.push_back(random_floats(static_cast<size_t>(n), -0.2f, 0.2f, seed++));
      const std::vector<float> gate = c.vectors[0];
      c.ops = [=](const Uploaded& up) {
        return std::vector<Op>{GatedAddOp{x, y, gin, gated ? up.vectors[0].get() : nullptr}};
      };
      Expect e{x, T, {}, {}};
      for (int t = 0; t < T; ++t) {
        double d = 0, mag = 0;
        for (int64_t i = 0; i < n; ++i) {
          d += static_cast<double>(gv[static_cast<size_t>(t * n + i)]) * gate[static_cast<size_t>(i)];
          mag += std::fabs(static_cast<double>(gv[static_cast<size_t>(t * n + i)]) * gate[static_cast<size_t>(i)]);
        }
        const double s = gated ? 1.0 / (1.0 + std::exp(-d)) : 1.0;
        const double s_err = gated ? 0.25 * (n + 2) * kU * mag + (kernels::kExpMaxRelError + 4 * kU) * s : 0.0;
        for (int64_t i = 0; i < n; ++i) {
          const double xi = xv[static_cast<size_t>(t * n + i)], yi = yv[static_cast<size_t>(t * n + i)];
          const double want = xi + s * yi;
          e.want.push_back(want);
          e.tol.push_back(s_err * std::fabs(yi) + kU * (std::fabs(want) + std::fabs(s * yi)) + 1e-30);
        }
      }
      c.expect.push_back(std::move(e));
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

}  // namespace metro::backends::testing
