#include "backends/encoder_op_cases.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/ops.h"

namespace metro::backends::testing {

// x + table[pos]: float addition is correctly rounded, so the result is exact.
std::vector<Case> pos_embed_cases() {
  std::vector<Case> cases;
  uint32_t seed = 200;
  for (int64_t n : {32, 384}) {
    const int T = 6, n_pos = 16;
    Case c = make_case("pos_embed n=" + std::to_string(n), T);
    c.pos = {0, 3, 1, 15, 7, 7};
    const ActId x = add_act(c, n);
    const auto xv = random_floats(static_cast<size_t>(T * n), -2.0f, 2.0f, seed++);
    set_rows(c, x, xv);
    const auto table = random_floats(static_cast<size_t>(n_pos * n), -1.0f, 1.0f, seed++);
    std::vector<uint8_t> bytes(table.size() * sizeof(float));
    std::memcpy(bytes.data(), table.data(), bytes.size());
    c.matrices.push_back({kernels::DType::kF32, n_pos, n, bytes, static_cast<size_t>(n) * sizeof(float), 0,
                          MatrixUse::kRows});
    c.ops = [x](const Uploaded& up) { return std::vector<Op>{PosEmbedOp{up.matrices[0].get(), x}}; };
    Expect e{x, T, {}, {}};
    for (int t = 0; t < T; ++t) {
      for (int64_t i = 0; i < n; ++i) {
        const size_t k = static_cast<size_t>(t * n + i);
        e.want.push_back(static_cast<double>(xv[k] + table[static_cast<size_t>(c.pos[static_cast<size_t>(t)] * n + i)]));
      }
    }
    e.tol.assign(e.want.size(), 0.0);
    c.expect.push_back(std::move(e));
    cases.push_back(std::move(c));
  }
  return cases;
}

// Mean and variance in double (exact to far below a float's rounding); then (x - m), one
// product by the float inverse (itself within 2u), one by the weight, one addition: within
// 6u of the normalized term's magnitude plus u of the result. Inputs share a large offset
// so that the variance's precision matters.
std::vector<Case> layer_norm_cases() {
  std::vector<Case> cases;
  uint32_t seed = 210;
  for (int64_t n : {7, 384, 1024}) {
    const int T = 5;
    Case c = make_case("layer_norm n=" + std::to_string(n), T);
    const ActId src = add_act(c, n), dst = add_act(c, n);
    const auto xv = random_floats(static_cast<size_t>(T * n), 40.0f, 44.0f, seed++);
    set_rows(c, src, xv);
    c.vectors.push_back(random_floats(static_cast<size_t>(n), 0.5f, 2.0f, seed++));
    c.vectors.push_back(random_floats(static_cast<size_t>(n), -1.0f, 1.0f, seed++));
    const float eps = 1e-12f;
    c.ops = [=](const Uploaded& up) {
      return std::vector<Op>{LayerNormOp{src, dst, up.vectors[0].get(), up.vectors[1].get(), eps}};
    };
    Expect e{dst, T, {}, {}};
    for (int t = 0; t < T; ++t) {
      const float* xr = xv.data() + static_cast<size_t>(t * n);
      double m = 0, v = 0;
      for (int64_t i = 0; i < n; ++i) m += xr[i];
      m /= static_cast<double>(n);
      for (int64_t i = 0; i < n; ++i) v += (xr[i] - m) * (xr[i] - m);
      const double inv = 1.0 / std::sqrt(v / static_cast<double>(n) + eps);
      for (int64_t i = 0; i < n; ++i) {
        const double term = (xr[i] - m) * inv * c.vectors[0][static_cast<size_t>(i)];
        const double want = term + c.vectors[1][static_cast<size_t>(i)];
        // (x - m) is formed in float from a float mean: its rounding is relative to |x|.
        const double sub = 2 * kU * (std::fabs(xr[i]) + std::fabs(m)) * inv * c.vectors[0][static_cast<size_t>(i)];
        e.want.push_back(want);
        e.tol.push_back(6 * kU * std::fabs(term) + sub + kU * std::fabs(want) + 1e-30);
      }
    }
    c.expect.push_back(std::move(e));
    cases.push_back(std::move(c));
  }
  return cases;
}

// x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) in float: erf within 2 ulps of 1 near its ends
// (where 1 + erf cancels), so an absolute bound of 8u |x|.
std::vector<Case> gelu_cases() {
  std::vector<Case> cases;
  uint32_t seed = 220;
  for (int64_t n : {7, 1536}) {
    const int T = 4;
    Case c = make_case("gelu n=" + std::to_string(n), T);
    const ActId x = add_act(c, n);
    auto xv = random_floats(static_cast<size_t>(T * n), -9.0f, 9.0f, seed++);
    xv[0] = 0.0f;
    xv[1] = -30.0f;
    set_rows(c, x, xv);
    c.ops = [x](const Uploaded&) { return std::vector<Op>{GeluOp{x}}; };
    Expect e{x, T, {}, {}};
    for (float v : xv) {
      e.want.push_back(0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))));
      e.tol.push_back(8 * kU * std::fabs(v) + 1e-30);
    }
    c.expect.push_back(std::move(e));
    cases.push_back(std::move(c));
  }
  return cases;
}

// Two sequences in one step, each attending to all of its own tokens and none of the
// other's. Scores are float dot products of head_dim terms (within (hd + 2)u of the
// magnitudes, times the scale), weights exp within kExpMaxRelError, the output a float sum
// of n weighted values over a float sum of weights: each element within (score error +
// exp error + (n + 4)u) x 2 x the weighted mean of |v|.
std::vector<Case> encoder_attention_cases() {
  std::vector<Case> cases;
  uint32_t seed = 230;
  struct Shape {
    int n_head, n_head_kv, hd;
  };
  for (const Shape s : {Shape{2, 2, 32}, Shape{4, 2, 16}, Shape{12, 12, 32}}) {
    const int lens[2] = {5, 9};
    const int T = lens[0] + lens[1];
    Case c = make_case("encoder_attention " + std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) + "x" +
                           std::to_string(s.hd),
                       T);
    c.runs = {{0, 0, lens[0], 0}, {1, lens[0], lens[1], 0}};
    for (int t = 0; t < T; ++t) {
      c.seq[static_cast<size_t>(t)] = t < lens[0] ? 0 : 1;
      c.pos[static_cast<size_t>(t)] = t < lens[0] ? t : t - lens[0];
    }
    const int64_t nq = int64_t{s.n_head} * s.hd, nkv = int64_t{s.n_head_kv} * s.hd;
    const ActId q = add_act(c, nq), k = add_act(c, nkv), v = add_act(c, nkv), out = add_act(c, nq);
    const auto qv = random_floats(static_cast<size_t>(T * nq), -1.5f, 1.5f, seed++);
    const auto kv = random_floats(static_cast<size_t>(T * nkv), -1.5f, 1.5f, seed++);
    const auto vv = random_floats(static_cast<size_t>(T * nkv), -1.0f, 1.0f, seed++);
    set_rows(c, q, qv);
    set_rows(c, k, kv);
    set_rows(c, v, vv);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
    const int nh = s.n_head, nhk = s.n_head_kv;
    c.ops = [=](const Uploaded&) { return std::vector<Op>{EncoderAttentionOp{q, k, v, out, nh, nhk, scale}}; };
    Expect e{out, T, std::vector<double>(static_cast<size_t>(T * nq)), std::vector<double>(static_cast<size_t>(T * nq))};
    const int group = s.n_head / s.n_head_kv;
    for (int r = 0; r < 2; ++r) {
      const int t0 = r == 0 ? 0 : lens[0], n = lens[r];
      for (int h = 0; h < s.n_head; ++h) {
        const size_t qo = static_cast<size_t>(h * s.hd), ko = static_cast<size_t>(h / group * s.hd);
        for (int i = 0; i < n; ++i) {
          std::vector<double> sc(static_cast<size_t>(n));
          double mx = -1e300, mag = 0.0;
          for (int j = 0; j < n; ++j) {
            double d = 0, dm = 0;
            for (int x = 0; x < s.hd; ++x) {
              const double a = qv[static_cast<size_t>((t0 + i) * nq) + qo + static_cast<size_t>(x)];
              const double b = kv[static_cast<size_t>((t0 + j) * nkv) + ko + static_cast<size_t>(x)];
              d += a * b;
              dm += std::fabs(a * b);
            }
            sc[static_cast<size_t>(j)] = d * scale;
            mag = std::max(mag, dm * scale);
            mx = std::max(mx, sc[static_cast<size_t>(j)]);
          }
          double tot = 0;
          for (double& p : sc) tot += (p = std::exp(p - mx));
          const double rel = (s.hd + 2) * kU * mag + kernels::kExpMaxRelError + (n + 4) * kU;
          for (int x = 0; x < s.hd; ++x) {
            double o = 0, om = 0;
            for (int j = 0; j < n; ++j) {
              const double val = vv[static_cast<size_t>((t0 + j) * nkv) + ko + static_cast<size_t>(x)];
              o += sc[static_cast<size_t>(j)] * val;
              om += sc[static_cast<size_t>(j)] * std::fabs(val);
            }
            const size_t idx = static_cast<size_t>((t0 + i) * nq) + qo + static_cast<size_t>(x);
            e.want[idx] = o / tot;
            e.tol[idx] = rel * 2 * om / tot + 1e-30;
          }
        }
      }
    }
    c.expect.push_back(std::move(e));
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace metro::backends::testing
