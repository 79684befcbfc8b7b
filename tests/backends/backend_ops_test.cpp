// Every op of the op set (backends/ops.h) on every backend this machine runs
// (backends::available_backends(): the CPU backend with each kernel set here, device
// backends where present), against the scalar references, op by op, on random inputs of
// several shapes, each with an error bound derived from the op's arithmetic. A backend
// joins by being listed in available_backends(); the cases know no backend.
//
// Bounds hold for any evaluation order (a sum of n terms in any order is within
// (n - 1) u of the sum of their magnitudes), so they do not assume one backend's
// summation tree. Every case also runs on 2 and 3 threads and must give the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "backends/backend_test_util.h"
#include "backends/encoder_op_cases.h"
#include "backends/lora_op_cases.h"
#include "backends/moe_op_cases.h"
#include "dist/communicator.h"
#include "kernels/attention_impl.h"
#include "kernels/kernel_set.h"
#include "kernels/kernel_test_util.h"
#include "kernels/quant_ref.h"

namespace metro::backends {
namespace {

namespace bt = metro::backends::testing;
namespace kt = metro::kernels::testing;
using bt::Case;
using bt::Expect;
using bt::KvSrc;
using bt::kU;
using bt::Uploaded;
using kernels::DType;

std::string type_name(DType t) { return std::string(kernels::dtype_name(t)); }

// ---- elementwise ops -----------------------------------------------------------------

std::vector<Case> embed_cases() {
  std::vector<Case> cases;
  uint32_t seed = 1;
  for (DType t : {DType::kF32, DType::kF16, DType::kQ8_0, DType::kQ4_1, DType::kQ4_K, DType::kQ6_K}) {
    for (int64_t n_embd : {256, 512}) {
      const int64_t n_vocab = 50;
      Case c = bt::make_case("embed " + type_name(t) + " n_embd=" + std::to_string(n_embd), 7);
      c.token = {3, 49, 0, 3, 17, 8, 22};
      const size_t rb = kernels::row_bytes(t, n_embd);
      c.matrices.push_back({t, n_vocab, n_embd, kt::quantize(t, kt::make_data(kt::Dist::kNormal, n_vocab * n_embd, seed++)),
                            rb, 0, MatrixUse::kRows});
      const ActId dst = bt::add_act(c, n_embd);
      c.ops = [dst](const Uploaded& up) { return std::vector<Op>{EmbedOp{up.matrices[0].get(), dst}}; };
      Expect e{dst, 7, {}, {}};
      std::vector<float> row(static_cast<size_t>(n_embd));
      for (int32_t id : c.token) {
        kernels::dequantize_row_ref(t, c.matrices[0].bytes.data() + static_cast<size_t>(id) * rb, row.data(), n_embd);
        e.want.insert(e.want.end(), row.begin(), row.end());
      }
      e.tol.assign(e.want.size(), 0.0);  // a copy of the reference's values
      c.expect.push_back(std::move(e));
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

struct RopeShape {
  int head_dim, n_rot;
  float base, linear_scale;
  bool factors;
  kernels::RopeMode mode;
  int n_head;
};
const RopeShape kRopeShapes[] = {{64, 64, 10000.0f, 1.0f, false, kernels::RopeMode::kNormal, 3},
                                 {128, 128, 500000.0f, 8.0f, true, kernels::RopeMode::kNeox, 2},
                                 {80, 32, 10000.0f, 2.0f, true, kernels::RopeMode::kNeox, 4},
                                 {96, 40, 10000.0f, 1.0f, false, kernels::RopeMode::kNormal, 1}};

std::shared_ptr<const kernels::Rope> make_rope(const RopeShape& s, std::vector<float>& factors) {
  factors = bt::random_floats(static_cast<size_t>(s.n_rot / 2), 1.0f, 8.0f, 12);
  kernels::RopeConfig rc;
  rc.head_dim = s.head_dim;
  rc.n_rot = s.n_rot;
  rc.freq_base = s.base;
  rc.linear_scale = s.linear_scale;
  rc.freq_factors = s.factors ? factors.data() : nullptr;
  rc.mode = s.mode;
  return std::make_shared<const kernels::Rope>(rc);
}

// cos and sin of theta_i = pos / linear_scale * base^(-2i/n_rot) / factor_i, rounded once
// to float (error <= u/2); the closed form in double is good to a few units of 2^-53 theta.
std::vector<Case> rope_angles_cases() {
  std::vector<Case> cases;
  for (const RopeShape& s : kRopeShapes) {
    Case c = bt::make_case("rope_angles n_rot=" + std::to_string(s.n_rot), 7);
    c.pos = {0, 1, 7, 100, 4095, 32768, 500000};
    std::vector<float> factors;
    c.rope = make_rope(s, factors);
    const ActId dst = bt::add_act(c, s.n_rot);
    const kernels::Rope* rope = c.rope.get();
    c.ops = [=](const Uploaded&) { return std::vector<Op>{RopeAnglesOp{rope, dst}}; };
    Expect e{dst, 7, {}, {}};
    const int half = s.n_rot / 2;
    for (int32_t pos : c.pos) {
      std::vector<double> cs(static_cast<size_t>(s.n_rot)), tol(cs.size());
      for (int i = 0; i < half; ++i) {
        double theta = static_cast<double>(pos) / s.linear_scale *
                       std::pow(static_cast<double>(s.base), -2.0 * i / s.n_rot);
        if (s.factors) theta /= factors[static_cast<size_t>(i)];
        cs[static_cast<size_t>(i)] = std::cos(theta);
        cs[static_cast<size_t>(half + i)] = std::sin(theta);
        tol[static_cast<size_t>(i)] = tol[static_cast<size_t>(half + i)] = kU + std::fabs(theta) * 0x1p-50;
      }
      e.want.insert(e.want.end(), cs.begin(), cs.end());
      e.tol.insert(e.tol.end(), tol.begin(), tol.end());
    }
    c.expect.push_back(std::move(e));
    cases.push_back(std::move(c));
  }
  return cases;
}

// The mean square is a sum of n positive terms, within (n + 8) u relative in any order
// (the division and eps included); 1/sqrt halves that and adds 2 roundings; then two
// products: relative 0.5 (n + 8) u + 6 u. Over logits rows the op reads token
// logit_rows[r].
std::vector<Case> rms_norm_cases() {
  std::vector<Case> cases;
  uint32_t seed = 30;
  for (int64_t n : {7, 64, 576, 1000}) {
    for (RowSet rows : {RowSet::kTokens, RowSet::kLogits}) {
      const int T = 5;
      const bool logits = rows == RowSet::kLogits;
      Case c = bt::make_case(std::string("rms_norm n=") + std::to_string(n) + (logits ? " logits rows" : ""), T, 3);
      c.logit_rows = {4, 0, 2};
      const ActId src = bt::add_act(c, n);
      const ActId dst = bt::add_act(c, n, rows);
      const auto x = bt::random_floats(static_cast<size_t>(T * n), -4.0f, 4.0f, seed++);
      bt::set_rows(c, src, x);
      c.vectors.push_back(bt::random_floats(static_cast<size_t>(n), 0.5f, 2.0f, seed++));
      const float eps = 1e-5f;
      c.ops = [=](const Uploaded& up) {
        return std::vector<Op>{RmsNormOp{src, dst, up.vectors[0].get(), eps, rows}};
      };
      const int R = logits ? 3 : T;
      Expect e{dst, R, {}, {}};
      for (int r = 0; r < R; ++r) {
        const float* xr = x.data() + static_cast<size_t>(logits ? c.logit_rows[static_cast<size_t>(r)] : r) * n;
        double ms = 0;
        for (int64_t i = 0; i < n; ++i) ms += static_cast<double>(xr[i]) * xr[i];
        const double inv = 1.0 / std::sqrt(ms / static_cast<double>(n) + eps);
        for (int64_t i = 0; i < n; ++i) {
          const double want = xr[i] * inv * c.vectors[0][static_cast<size_t>(i)];
          e.want.push_back(want);
          e.tol.push_back((0.5 * (static_cast<double>(n) + 8) + 6) * kU * std::fabs(want) + 1e-30);
        }
      }
      c.expect.push_back(std::move(e));
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

// Per-head norms in place: each head_dim-wide segment normed alone with one shared weight;
// the bound is rms_norm's over head_dim values.
std::vector<Case> head_norm_cases() {
  std::vector<Case> cases;
  uint32_t seed = 40;
  for (auto [n_head, hd] : {std::pair{4, 8}, std::pair{3, 64}, std::pair{16, 128}}) {
    const int T = 5;
    const int64_t n = int64_t{n_head} * hd;
    Case c = bt::make_case("head_norm " + std::to_string(n_head) + "x" + std::to_string(hd), T);
    const ActId x = bt::add_act(c, n);
    const auto xv = bt::random_floats(static_cast<size_t>(T * n), -4.0f, 4.0f, seed++);
    bt::set_rows(c, x, xv);
    c.vectors.push_back(bt::random_floats(static_cast<size_t>(hd), 0.5f, 2.0f, seed++));
    const float eps = 1e-6f;
    const int heads = n_head;
    c.ops = [=](const Uploaded& up) { return std::vector<Op>{HeadNormOp{x, up.vectors[0].get(), heads, eps}}; };
    Expect e{x, T, {}, {}};
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < n_head; ++h) {
        const float* xr = xv.data() + static_cast<size_t>(t * n + h * hd);
        double ms = 0;
        for (int i = 0; i < hd; ++i) ms += static_cast<double>(xr[i]) * xr[i];
        const double inv = 1.0 / std::sqrt(ms / hd + eps);
        for (int i = 0; i < hd; ++i) {
          const double want = xr[i] * inv * c.vectors[0][static_cast<size_t>(i)];
          e.want.push_back(want);
          e.tol.push_back((0.5 * (hd + 8) + 6) * kU * std::fabs(want) + 1e-30);
        }
      }
    }
    c.expect.push_back(std::move(e));
    cases.push_back(std::move(c));
  }
  return cases;
}

// Float addition is correctly rounded: the result is the reference's, exactly.
std::vector<Case> add_cases(bool bias) {
  std::vector<Case> cases;
  uint32_t seed = 50;
  for (int64_t n : {7, 64, 576}) {
    const int T = 5;
    Case c = bt::make_case(std::string(bias ? "add_bias" : "add") + " n=" + std::to_string(n), T);
    const ActId a = bt::add_act(c, n);
    const auto x = bt::random_floats(static_cast<size_t>(T * n), -3.0f, 3.0f, seed++);
    bt::set_rows(c, a, x);
    std::vector<float> y;
    ActId b{}, dst = a;
    if (bias) {
      c.vectors.push_back(bt::random_floats(static_cast<size_t>(n), -1.0f, 1.0f, seed++));
      for (int t = 0; t < T; ++t) y.insert(y.end(), c.vectors[0].begin(), c.vectors[0].end());
      c.ops = [=](const Uploaded& up) { return std::vector<Op>{AddBiasOp{a, up.vectors[0].get()}}; };
    } else {
      b = bt::add_act(c, n);
      dst = bt::add_act(c, n);
      y = bt::random_floats(static_cast<size_t>(T * n), -1e3f, 1e3f, seed++);
      bt::set_rows(c, b, y);
      c.ops = [=](const Uploaded&) { return std::vector<Op>{AddOp{a, b, dst}}; };
    }
    Expect e{dst, T, {}, {}};
    for (size_t i = 0; i < x.size(); ++i) e.want.push_back(static_cast<double>(x[i] + y[i]));
    e.tol.assign(e.want.size(), 0.0);
    c.expect.push_back(std::move(e));
    cases.push_back(std::move(c));
  }
  return cases;
}

// silu(g) up = g up / (1 + e^-g): the exp's error (kExpMaxRelError) and 4 roundings.
std::vector<Case> swiglu_cases() {
  std::vector<Case> cases;
  uint32_t seed = 70;
  for (int64_t n : {7, 64, 1536}) {
    const int T = 4;
    Case c = bt::make_case("swiglu n=" + std::to_string(n), T);
    const ActId g = bt::add_act(c, n), u = bt::add_act(c, n);
    const auto gv = bt::random_floats(static_cast<size_t>(T * n), -20.0f, 20.0f, seed++);
    const auto uv = bt::random_floats(static_cast<size_t>(T * n), -3.0f, 3.0f, seed++);
    bt::set_rows(c, g, gv);
    bt::set_rows(c, u, uv);
    c.ops = [=](const Uploaded&) { return std::vector<Op>{SwigluOp{g, u, g}}; };  // in place
    Expect e{g, T, {}, {}};
    for (size_t i = 0; i < gv.size(); ++i) {
      const double want = gv[i] / (1.0 + std::exp(-static_cast<double>(gv[i]))) * uv[i];
      e.want.push_back(want);
      e.tol.push_back((kernels::kExpMaxRelError + 4 * kU) * std::fabs(want) + 1e-30);
    }
    c.expect.push_back(std::move(e));
    cases.push_back(std::move(c));
  }
  return cases;
}

// Each rotated component is x_a c - x_b s (or x_a s + x_b c) with c, s given: two products
// and a sum, at most 2u of the products' magnitudes plus u of the result. Dims past n_rot
// pass through.
std::vector<Case> rope_cases() {
  std::vector<Case> cases;
  uint32_t seed = 90;
  for (const RopeShape& s : kRopeShapes) {
    const int T = 4, half = s.n_rot / 2;
    const int64_t width = int64_t{s.n_head} * s.head_dim;
    Case c = bt::make_case("rope head_dim=" + std::to_string(s.head_dim) + " n_rot=" + std::to_string(s.n_rot) +
                               (s.mode == kernels::RopeMode::kNeox ? " neox" : " normal"), T);
    std::vector<float> factors;
    c.rope = make_rope(s, factors);
    const ActId x = bt::add_act(c, width), cs = bt::add_act(c, s.n_rot);
    const auto xv = bt::random_floats(static_cast<size_t>(T * width), -2.0f, 2.0f, seed++);
    const auto theta = bt::random_floats(static_cast<size_t>(T * half), -10.0f, 10.0f, seed++);
    std::vector<float> csv;
    for (int t = 0; t < T; ++t) {
      for (int i = 0; i < half; ++i) csv.push_back(std::cos(theta[static_cast<size_t>(t * half + i)]));
      for (int i = 0; i < half; ++i) csv.push_back(std::sin(theta[static_cast<size_t>(t * half + i)]));
    }
    bt::set_rows(c, x, xv);
    bt::set_rows(c, cs, csv);
    const kernels::Rope* rope = c.rope.get();
    const int n_head = s.n_head;
    c.ops = [=](const Uploaded&) { return std::vector<Op>{RopeOp{rope, x, cs, n_head}}; };
    Expect e{x, T, std::vector<double>(xv.begin(), xv.end()), std::vector<double>(xv.size(), 0.0)};
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < s.n_head; ++h) {
        const size_t base = static_cast<size_t>(t * width + h * s.head_dim);
        for (int i = 0; i < half; ++i) {
          const size_t a = base + static_cast<size_t>(s.mode == kernels::RopeMode::kNormal ? 2 * i : i);
          const size_t b = base + static_cast<size_t>(s.mode == kernels::RopeMode::kNormal ? 2 * i + 1 : i + half);
          const double co = csv[static_cast<size_t>(t * s.n_rot + i)];
          const double si = csv[static_cast<size_t>(t * s.n_rot + half + i)];
          const double xa = xv[a], xb = xv[b];
          e.want[a] = xa * co - xb * si;
          e.want[b] = xa * si + xb * co;
          e.tol[a] = 2 * kU * (std::fabs(xa * co) + std::fabs(xb * si)) + kU * std::fabs(e.want[a]);
          e.tol[b] = 2 * kU * (std::fabs(xa * si) + std::fabs(xb * co)) + kU * std::fabs(e.want[b]);
        }
      }
    }
    c.expect.push_back(std::move(e));
    cases.push_back(std::move(c));
  }
  return cases;
}

// ---- KV pages -------------------------------------------------------------------------

struct KvShape {
  DType type;
  int block_size, n_head_kv, head_dim;
};

// Two sequences with shuffled blocks in one arena of 2 layers; `runs` as (n tokens, pos0).
KvSrc make_kv(const KvShape& s, const std::vector<std::pair<int, int64_t>>& runs, Case& c, uint8_t fill) {
  KvSrc kv;
  kv.layout = {s.type, s.block_size, s.n_head_kv, s.head_dim};
  kv.n_layer = 2;
  std::vector<int> need;
  for (const auto& [n, pos0] : runs) need.push_back(static_cast<int>((pos0 + n + s.block_size - 1) / s.block_size));
  kv.n_blocks = std::accumulate(need.begin(), need.end(), 0) + 2;
  std::vector<int32_t> ids(static_cast<size_t>(kv.n_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  size_t next = 0;
  c.token.clear();
  c.pos.clear();
  c.seq.clear();
  c.runs.clear();
  for (size_t r = 0; r < runs.size(); ++r) {
    kv.tables.emplace_back(ids.begin() + static_cast<ptrdiff_t>(next), ids.begin() + static_cast<ptrdiff_t>(next) + need[r]);
    next += static_cast<size_t>(need[r]);
    c.runs.push_back({static_cast<int>(r), static_cast<int>(c.token.size()), runs[r].first, runs[r].second});
    for (int i = 0; i < runs[r].first; ++i) {
      c.token.push_back(static_cast<int32_t>(c.token.size()));
      c.pos.push_back(static_cast<int32_t>(runs[r].second + i));
      c.seq.push_back(static_cast<int32_t>(r));
    }
  }
  const size_t page = kv.layout.page_bytes();
  kv.bytes.assign(page * 2 * static_cast<size_t>(kv.n_layer) * static_cast<size_t>(kv.n_blocks), fill);
  return kv;
}

size_t page_offset(const KvSrc& kv, int32_t block, int layer, bool v) {
  const size_t page = kv.layout.page_bytes();
  return static_cast<size_t>(block) * page * 2 * static_cast<size_t>(kv.n_layer) +
         static_cast<size_t>(2 * layer + (v ? 1 : 0)) * page;
}

// Writes one token's K or V rows (n_head_kv heads) the reference way.
void store_ref(KvSrc& kv, std::vector<uint8_t>& bytes, int32_t seq, int64_t pos, int layer, bool v, const float* x) {
  const auto& l = kv.layout;
  const int32_t block = kv.tables[static_cast<size_t>(seq)][static_cast<size_t>(pos / l.block_size)];
  for (int h = 0; h < l.n_head_kv; ++h) {
    uint8_t* dst = bytes.data() + page_offset(kv, block, layer, v) + static_cast<size_t>(h) * l.head_bytes() +
                   static_cast<size_t>(pos % l.block_size) * l.row_bytes();
    kernels::quantize_row_ref(l.type, x + static_cast<size_t>(h) * l.head_dim, dst, l.head_dim);
  }
}

// Stored K/V rows are the reference quantizer's bytes exactly; nothing else in the arena
// changes.
std::vector<Case> kv_store_cases() {
  std::vector<Case> cases;
  uint32_t seed = 110;
  for (const KvShape& s : {KvShape{DType::kF16, 16, 3, 64}, KvShape{DType::kQ8_0, 5, 2, 128},
                           KvShape{DType::kF16, 1, 1, 64}}) {
    Case c = bt::make_case("kv_store " + type_name(s.type) + " block " + std::to_string(s.block_size), 12);
    KvSrc kv = make_kv(s, {{7, 3}, {5, 0}}, c, 0);
    std::mt19937 rng(seed++);
    for (auto& b : kv.bytes) b = static_cast<uint8_t>(rng());
    const int64_t width = int64_t{s.n_head_kv} * s.head_dim;
    const ActId k = bt::add_act(c, width), v = bt::add_act(c, width);
    const auto kv_k = bt::random_floats(static_cast<size_t>(12 * width), -2.0f, 2.0f, seed++);
    const auto kv_v = bt::random_floats(static_cast<size_t>(12 * width), -2.0f, 2.0f, seed++);
    bt::set_rows(c, k, kv_k);
    bt::set_rows(c, v, kv_v);
    c.want_kv = kv.bytes;
    for (size_t t = 0; t < c.token.size(); ++t) {
      store_ref(kv, c.want_kv, c.seq[t], c.pos[t], 1, false, kv_k.data() + t * static_cast<size_t>(width));
      store_ref(kv, c.want_kv, c.seq[t], c.pos[t], 1, true, kv_v.data() + t * static_cast<size_t>(width));
    }
    c.kv = std::move(kv);
    c.ops = [=](const Uploaded&) { return std::vector<Op>{KvStoreOp{k, v, 1}}; };
    cases.push_back(std::move(c));
  }
  return cases;
}

struct AttentionShape {
  int n_head;
  KvShape kv;
  std::vector<std::pair<int, int64_t>> runs;  // (queries, pos0)
};

// Against the dense double-precision reference (kernels::attention_ref) over the same
// pages, with the bound of kernel_test_util.h at the depth of a sequential sum (any
// order). Against Q8_0 keys each scaled query row is rounded to int8 per block of 32
// (kernels/attention_impl.h), so the reference runs on those rounded queries. Unwritten
// page bytes are 0xFF (NaN in F16, a NaN scale in Q8_0): a read of one shows.
std::vector<Case> attention_cases() {
  const std::vector<AttentionShape> shapes = {
      {9, {DType::kF16, 16, 3, 64}, {{1, 40}, {7, 0}, {33, 20}}},
      {8, {DType::kQ8_0, 5, 8, 128}, {{5, 11}, {1, 0}}},
      {4, {DType::kQ8_0, 32, 1, 64}, {{40, 3}}},
      {6, {DType::kF16, 16, 2, 64}, {{1, 0}, {2, 70}}}};
  std::vector<Case> cases;
  uint32_t seed = 130;
  for (const AttentionShape& s : shapes) {
    const int hd = s.kv.head_dim;
    int T = 0;
    for (const auto& r : s.runs) T += r.first;
    Case c = bt::make_case("attention " + type_name(s.kv.type) + " heads " + std::to_string(s.n_head) + "/" +
                               std::to_string(s.kv.n_head_kv) + " block " + std::to_string(s.kv.block_size),
                           T);
    KvSrc kv = make_kv(s.kv, s.runs, c, 0xFF);
    const int64_t kv_width = int64_t{s.kv.n_head_kv} * hd, q_width = int64_t{s.n_head} * hd;
    // Every position of every sequence up to its last query: keys U(-1, 1), values 3 U(-1, 1).
    for (size_t r = 0; r < s.runs.size(); ++r) {
      for (int64_t pos = 0; pos < s.runs[r].second + s.runs[r].first; ++pos) {
        const auto kr = bt::random_floats(static_cast<size_t>(kv_width), -1.0f, 1.0f, seed++);
        const auto vr = bt::random_floats(static_cast<size_t>(kv_width), -3.0f, 3.0f, seed++);
        store_ref(kv, kv.bytes, static_cast<int32_t>(r), pos, 1, false, kr.data());
        store_ref(kv, kv.bytes, static_cast<int32_t>(r), pos, 1, true, vr.data());
      }
    }
    const ActId q = bt::add_act(c, q_width), out = bt::add_act(c, q_width);
    const auto qv = bt::random_floats(static_cast<size_t>(T * q_width), -2.5f, 2.5f, seed++);
    bt::set_rows(c, q, qv);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const int n_head = s.n_head;
    c.ops = [=](const Uploaded&) { return std::vector<Op>{AttentionOp{q, out, 1, n_head, scale}}; };

    // The reference, sequence by sequence, over host copies of the pages.
    kernels::AttentionParams p;
    p.layout = kv.layout;
    p.n_head = s.n_head;
    p.scale = scale;
    std::vector<float> ref_q = qv;
    if (s.kv.type == DType::kQ8_0) {
      std::vector<float> scaled(static_cast<size_t>(hd));
      std::vector<int8_t> qi(scaled.size());
      std::vector<float> qd(scaled.size() / 32);
      for (size_t row = 0; row < ref_q.size(); row += static_cast<size_t>(hd)) {
        for (int d = 0; d < hd; ++d) scaled[static_cast<size_t>(d)] = ref_q[row + static_cast<size_t>(d)] * scale;
        kernels::detail::quantize_query_q8(scaled.data(), hd, qi.data(), qd.data());
        for (int d = 0; d < hd; ++d) {
          ref_q[row + static_cast<size_t>(d)] = static_cast<float>(static_cast<double>(qi[static_cast<size_t>(d)]) *
                                                                  qd[static_cast<size_t>(d / 32)] / scale);
        }
      }
    }
    Expect e{out, T, std::vector<double>(static_cast<size_t>(T * q_width)), std::vector<double>(static_cast<size_t>(T * q_width))};
    std::vector<float> ref_out(static_cast<size_t>(T * q_width));
    const int group = s.n_head / s.kv.n_head_kv;
    for (const SeqRun& run : c.runs) {
      std::vector<const uint8_t*> kp, vp;
      for (int32_t block : kv.tables[static_cast<size_t>(run.seq)]) {
        kp.push_back(kv.bytes.data() + page_offset(kv, block, 1, false));
        vp.push_back(kv.bytes.data() + page_offset(kv, block, 1, true));
      }
      kernels::AttentionSeq sq;
      sq.q = ref_q.data() + static_cast<size_t>(run.start * q_width);
      sq.out = ref_out.data() + static_cast<size_t>(run.start * q_width);
      sq.n_q = run.n;
      sq.pos0 = run.pos0;
      sq.k_pages = kp.data();
      sq.v_pages = vp.data();
      sq.q_stride = sq.out_stride = static_cast<size_t>(q_width);
      kernels::attention_ref(p, sq);
      // Dense rows of each KV head for the bound.
      const int64_t n_keys = run.pos0 + run.n;
      for (int kvh = 0; kvh < s.kv.n_head_kv; ++kvh) {
        std::vector<float> dk(static_cast<size_t>(n_keys * hd)), dv(dk.size());
        for (int64_t pos = 0; pos < n_keys; ++pos) {
          const int slot = static_cast<int>(pos % s.kv.block_size);
          kernels::kv_load(kv.layout, kp[static_cast<size_t>(pos / s.kv.block_size)], slot, kvh, dk.data() + pos * hd);
          kernels::kv_load(kv.layout, vp[static_cast<size_t>(pos / s.kv.block_size)], slot, kvh, dv.data() + pos * hd);
        }
        for (int i = 0; i < run.n; ++i) {
          for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
            const size_t off = static_cast<size_t>((run.start + i) * q_width + h * hd);
            const double tol = kt::attention_row_tolerance(ref_q.data() + off, dk.data(), dv.data(),
                                                           run.pos0 + i + 1, hd, scale, hd);
            for (int d = 0; d < hd; ++d) e.tol[off + static_cast<size_t>(d)] = tol;
          }
        }
      }
    }
    std::copy(ref_out.begin(), ref_out.end(), e.want.begin());
    c.expect.push_back(std::move(e));
    c.kv = std::move(kv);
    cases.push_back(std::move(c));
  }
  return cases;
}

// ---- products -------------------------------------------------------------------------

struct ProductOut {
  DType type;
  int64_t n;  // weight rows
};

// Y = X Wᵀ for up to 3 weights sharing X. Each output is compared with vec_dot_ref on the
// activations quantized by the reference quantizer to the weight's dot partner (a backend
// quantizes as the reference does): the block terms are exact integers turned into float,
// so only combining them rounds: |y - ref| <= (n_terms + 8) u * magnitude, n_terms the
// number of blocks (k for the float formats); we allow twice that.
Case project_case(const std::string& name, const std::vector<ProductOut>& outs, int64_t k, int m, RowSet rows,
                  uint32_t seed) {
  const bool logits = rows == RowSet::kLogits;
  Case c = bt::make_case(name, logits ? 3 : m, logits ? m : 0);
  if (logits) {
    c.logit_rows.clear();
    for (int r = 0; r < m; ++r) c.logit_rows.push_back(r % 3);
  }
  const ActId src = bt::add_act(c, k, rows);
  const auto x = kt::make_data(seed % 2 ? kt::Dist::kOutliers : kt::Dist::kNormal, m * k, seed);
  bt::set_rows(c, src, x);
  std::vector<ActId> dst;
  std::vector<DType> types;
  for (const ProductOut& o : outs) {
    c.matrices.push_back({o.type, o.n, k, kt::quantize(o.type, kt::make_data(kt::Dist::kNormal, o.n * k, seed + 7)),
                          kernels::row_bytes(o.type, k), 0, MatrixUse::kProduct});
    dst.push_back(bt::add_act(c, o.n, rows));
    types.push_back(o.type);
  }
  bt::count_products(c, static_cast<int>(outs.size()), types, k);
  c.ops = [=](const Uploaded& up) {
    ProjectOp p{src, rows, static_cast<int>(dst.size()), {}, {}};
    for (size_t i = 0; i < dst.size(); ++i) {
      p.w[i] = up.matrices[i].get();
      p.dst[i] = dst[i];
    }
    return std::vector<Op>{p};
  };
  for (size_t o = 0; o < outs.size(); ++o) {
    const DType t = outs[o].type, partner = kernels::traits(t).dot_partner;
    const double n_terms = static_cast<double>(partner == DType::kF32 ? k : k / kernels::traits(partner).block_size);
    const size_t rb = kernels::row_bytes(t, k);
    Expect e{dst[o], m, {}, {}};
    for (int i = 0; i < m; ++i) {
      const auto a = kt::quantize(partner, std::vector<float>(x.begin() + i * k, x.begin() + (i + 1) * k));
      for (int64_t j = 0; j < outs[o].n; ++j) {
        const uint8_t* w = c.matrices[o].bytes.data() + static_cast<size_t>(j) * rb;
        e.want.push_back(kernels::vec_dot_ref(t, w, a.data(), k));
        e.tol.push_back(2 * (n_terms + 8) * kU * kernels::vec_dot_magnitude_ref(t, w, a.data(), k) + 1e-30);
      }
    }
    c.expect.push_back(std::move(e));
  }
  return c;
}

std::vector<Case> project_cases() {
  std::vector<Case> cases;
  uint32_t seed = 1;
  for (DType t : kt::weight_types()) {
    for (auto [n, k, m] : {std::tuple{37, 256, 5}, std::tuple{8, 512, 1}, std::tuple{20, 256, 70}}) {
      cases.push_back(project_case("project " + type_name(t) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                                       " m=" + std::to_string(m),
                                   {{t, n}}, k, m, RowSet::kTokens, seed++));
    }
  }
  // Three dot partners (Q8_0, Q8_1, Q8_K) share one input; two weights share one partner.
  cases.push_back(project_case("project Q4_0+Q4_1+Q4_K", {{DType::kQ4_0, 16}, {DType::kQ4_1, 24}, {DType::kQ4_K, 8}},
                               256, 9, RowSet::kTokens, seed++));
  cases.push_back(project_case("project Q8_0+F16+Q4_0", {{DType::kQ8_0, 24}, {DType::kF16, 16}, {DType::kQ4_0, 8}},
                               512, 3, RowSet::kTokens, seed++));
  cases.push_back(project_case("project Q6_K logits rows", {{DType::kQ6_K, 40}}, 256, 4, RowSet::kLogits, seed++));
  return cases;
}

// ---- the cases of every op kind -------------------------------------------------------

struct KindCases {
  OpKind kind;
  std::vector<Case> (*make)();
};
const KindCases kCases[] = {
    {OpKind::kEmbed, embed_cases},
    {OpKind::kRopeAngles, rope_angles_cases},
    {OpKind::kRmsNorm, rms_norm_cases},
    {OpKind::kProject, project_cases},
    {OpKind::kAddBias, [] { return add_cases(true); }},
    {OpKind::kRope, rope_cases},
    {OpKind::kKvStore, kv_store_cases},
    {OpKind::kAttention, attention_cases},
    {OpKind::kAdd, [] { return add_cases(false); }},
    {OpKind::kSwiglu, swiglu_cases},
    {OpKind::kHeadNorm, head_norm_cases},
    {OpKind::kPosEmbed, bt::pos_embed_cases},
    {OpKind::kLayerNorm, bt::layer_norm_cases},
    {OpKind::kGelu, bt::gelu_cases},
    {OpKind::kEncoderAttention, bt::encoder_attention_cases},
    {OpKind::kMoe, bt::moe_cases},
    {OpKind::kGatedAdd, bt::gated_add_cases},
    {OpKind::kLora, bt::lora_cases},
};

void run_cases(const std::string& backend, OpKind kind) {
  auto b = bt::backend_named(backend);
  ASSERT_NE(b, nullptr);
  for (const KindCases& kc : kCases) {
    if (kc.kind != kind) continue;
    for (const Case& c : kc.make()) {
      SCOPED_TRACE(backend + ": " + c.name);
      const Uploaded up = bt::upload(*b, c);
      const bt::Outcome one = bt::run(*b, c, up, 1);
      bt::expect_matches(c, one);
      if (::testing::Test::HasFatalFailure()) return;
      for (int nth : {2, 3}) bt::expect_same_bits(one, bt::run(*b, c, up, nth), std::to_string(nth) + " threads");
    }
  }
}

// Runs rank r's case on its own instance of the backend, all ranks at once.
std::vector<bt::Outcome> run_ranks(const std::string& backend, const std::vector<Case>& cases) {
  std::vector<bt::Outcome> out(cases.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < cases.size(); ++r) {
    threads.emplace_back([&, r] {
      auto b = bt::backend_named(backend);
      const Uploaded up = bt::upload(*b, cases[r]);
      out[r] = bt::run(*b, cases[r], up, 1);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

class BackendOps : public ::testing::TestWithParam<std::string> {};

TEST_P(BackendOps, Embed) { run_cases(GetParam(), OpKind::kEmbed); }
TEST_P(BackendOps, RopeAngles) { run_cases(GetParam(), OpKind::kRopeAngles); }
TEST_P(BackendOps, RmsNorm) { run_cases(GetParam(), OpKind::kRmsNorm); }
TEST_P(BackendOps, Project) { run_cases(GetParam(), OpKind::kProject); }
TEST_P(BackendOps, AddBias) { run_cases(GetParam(), OpKind::kAddBias); }
TEST_P(BackendOps, Rope) { run_cases(GetParam(), OpKind::kRope); }
TEST_P(BackendOps, KvStore) { run_cases(GetParam(), OpKind::kKvStore); }
TEST_P(BackendOps, Attention) { run_cases(GetParam(), OpKind::kAttention); }
TEST_P(BackendOps, Add) { run_cases(GetParam(), OpKind::kAdd); }
TEST_P(BackendOps, Swiglu) { run_cases(GetParam(), OpKind::kSwiglu); }
TEST_P(BackendOps, HeadNorm) { run_cases(GetParam(), OpKind::kHeadNorm); }
// Encoder ops run on the CPU backend only (a device backend refuses encoder models at load).
void run_encoder_cases(const std::string& backend, OpKind kind) {
  if (!backend.starts_with("cpu")) GTEST_SKIP() << "encoder ops run on the CPU backend only";
  run_cases(backend, kind);
}
TEST_P(BackendOps, PosEmbed) { run_encoder_cases(GetParam(), OpKind::kPosEmbed); }
TEST_P(BackendOps, LayerNorm) { run_encoder_cases(GetParam(), OpKind::kLayerNorm); }
TEST_P(BackendOps, Gelu) { run_encoder_cases(GetParam(), OpKind::kGelu); }
TEST_P(BackendOps, EncoderAttention) { run_encoder_cases(GetParam(), OpKind::kEncoderAttention); }
// Mixture-of-experts ops likewise (a device backend refuses such models at load).
TEST_P(BackendOps, Moe) { run_encoder_cases(GetParam(), OpKind::kMoe); }
TEST_P(BackendOps, GatedAdd) { run_encoder_cases(GetParam(), OpKind::kGatedAdd); }
// Run-time LoRA likewise (a device backend refuses adapters at load).
TEST_P(BackendOps, Lora) { run_encoder_cases(GetParam(), OpKind::kLora); }

// Each rank's rows become the sum of every rank's, added in rank order: exactly the float
// sum x_0 + x_1 + ..., the same bits on every rank; rows past the step's stay as they were.
TEST_P(BackendOps, AllReduce) {
  for (int n_ranks : {2, 3}) {
    SCOPED_TRACE(std::to_string(n_ranks) + " ranks");
    auto group = dist::make_local_group(n_ranks);
    const int T = 5;
    const int64_t n = 67;
    std::vector<Case> cases;
    std::vector<std::vector<float>> xs;
    for (int r = 0; r < n_ranks; ++r) {
      Case c = bt::make_case("all_reduce rank " + std::to_string(r), T);
      const ActId x = bt::add_act(c, n);
      xs.push_back(bt::random_floats(static_cast<size_t>(T * n), -1e4f, 1e4f, static_cast<uint32_t>(200 + r)));
      bt::set_rows(c, x, xs.back());
      dist::Communicator* comm = group[static_cast<size_t>(r)].get();
      c.ops = [=](const Uploaded&) { return std::vector<Op>{AllReduceOp{x, comm}}; };
      cases.push_back(std::move(c));
    }
    std::vector<float> sum = xs[0];
    for (int r = 1; r < n_ranks; ++r) {
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += xs[static_cast<size_t>(r)][i];
    }
    for (Case& c : cases) c.expect.push_back({ActId{0}, T, std::vector<double>(sum.begin(), sum.end()), std::vector<double>(sum.size(), 0.0)});
    const auto out = run_ranks(GetParam(), cases);
    for (size_t r = 0; r < cases.size(); ++r) bt::expect_matches(cases[r], out[r]);
  }
}

// Tensor parallelism's product: each rank multiplies its block-aligned columns of X by its
// columns of W (a strided slice of the GGUF rows), then the ranks all-reduce. Each partial
// is within (n_r + 8) u of its magnitude, and adding N partials rounds N - 1 more times:
// |y - ref| <= (n_terms + 9 N) u * magnitude; we allow twice that. Every rank ends with
// the same bits.
TEST_P(BackendOps, ProjectSlicedOverRanksThenAllReduced) {
  uint32_t seed = 300;
  for (DType t : {DType::kF16, DType::kQ8_0, DType::kQ4_1, DType::kQ6_K}) {
    for (int n_ranks : {2, 3}) {
      SCOPED_TRACE(type_name(t) + ", " + std::to_string(n_ranks) + " ranks");
      const int64_t k = 1024, n = 24;
      const int m = 5;
      const DType partner = kernels::traits(t).dot_partner;
      const int64_t align = std::max(kernels::traits(t).block_size, kernels::traits(partner).block_size);
      const auto x = kt::make_data(kt::Dist::kNormal, m * k, seed++);
      const auto wbytes = kt::quantize(t, kt::make_data(kt::Dist::kNormal, n * k, seed++));
      const size_t rb = kernels::row_bytes(t, k);
      auto group = dist::make_local_group(n_ranks);
      std::vector<Case> cases;
      for (int r = 0; r < n_ranks; ++r) {
        const int64_t units = k / align;
        const int64_t c0 = units * r / n_ranks * align, c1 = units * (r + 1) / n_ranks * align;
        Case c = bt::make_case("rank " + std::to_string(r), m);
        const ActId src = bt::add_act(c, c1 - c0), y = bt::add_act(c, n);
        std::vector<float> xr;
        for (int i = 0; i < m; ++i) xr.insert(xr.end(), x.begin() + i * k + c0, x.begin() + i * k + c1);
        bt::set_rows(c, src, xr);
        c.matrices.push_back({t, n, c1 - c0, wbytes, rb, kernels::row_bytes(t, c0), MatrixUse::kProduct});
        bt::count_products(c, 1, {t}, c1 - c0);
        dist::Communicator* comm = group[static_cast<size_t>(r)].get();
        c.ops = [=](const Uploaded& up) {
          return std::vector<Op>{ProjectOp{src, RowSet::kTokens, 1, {up.matrices[0].get()}, {y}}, AllReduceOp{y, comm}};
        };
        cases.push_back(std::move(c));
      }
      const double n_terms = static_cast<double>(partner == DType::kF32 ? k : k / kernels::traits(partner).block_size);
      Expect e{ActId{1}, m, {}, {}};
      for (int i = 0; i < m; ++i) {
        const auto a = kt::quantize(partner, std::vector<float>(x.begin() + i * k, x.begin() + (i + 1) * k));
        for (int64_t j = 0; j < n; ++j) {
          const uint8_t* w = wbytes.data() + static_cast<size_t>(j) * rb;
          e.want.push_back(kernels::vec_dot_ref(t, w, a.data(), k));
          e.tol.push_back(2 * (n_terms + 9 * n_ranks) * kU * kernels::vec_dot_magnitude_ref(t, w, a.data(), k) + 1e-30);
        }
      }
      for (Case& c : cases) c.expect.push_back(e);
      const auto out = run_ranks(GetParam(), cases);
      for (size_t r = 0; r < cases.size(); ++r) {
        bt::expect_matches(cases[r], out[r]);
        EXPECT_EQ(0, std::memcmp(out[r].acts[1].data(), out[0].acts[1].data(), out[0].acts[1].size() * sizeof(float)))
            << "rank " << r << " differs from rank 0";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Available, BackendOps, ::testing::ValuesIn(bt::backend_names()),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string s = p.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// Every kind of op has cases above (AllReduce in its own multi-rank tests).
TEST(BackendOpsHarness, CoversEveryOpKind) {
  for (int k = 0; k < kNumOpKinds; ++k) {
    const OpKind kind = static_cast<OpKind>(k);
    if (kind == OpKind::kAllReduce) continue;
    const bool found = std::any_of(std::begin(kCases), std::end(kCases), [&](const KindCases& kc) { return kc.kind == kind; });
    EXPECT_TRUE(found) << op_name(kind) << " has no cases";
  }
}

// The CPU with each of its kernel sets is there, the scalar reference first; device
// backends (registry_test.cpp) come after them.
TEST(BackendOpsHarness, ListsTheCpuWithEachKernelSet) {
  const auto names = bt::backend_names();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names[0], "cpu-scalar");
  const auto cpu = std::count_if(names.begin(), names.end(), [](const std::string& n) { return n.starts_with("cpu-"); });
  EXPECT_EQ(static_cast<size_t>(cpu), kernels::kernel_sets().size());
  for (size_t i = 0; i < static_cast<size_t>(cpu); ++i) EXPECT_TRUE(names[i].starts_with("cpu-")) << names[i];
}

}  // namespace
}  // namespace metro::backends
