// Importance-weighted quantization: the importance of each column from a calibration text
// (checked against a direct computation of layer 0's inputs), the weighted quantizers (less
// weighted error than unweighted rounding; the unweighted path untouched), and
// `metro quantize --imatrix` end to end on a synthetic model.
#include "model/importance.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/quant_ref.h"
#include "model/hparams.h"
#include "model/reference_forward.h"
#include "support/synthetic_model.h"
#include "support/test_util.h"

namespace metro::model {
namespace {

std::vector<float> dequant_row(const gguf::TensorInfo& t, int64_t r) {
  const auto type = *kernels::dtype_from_ggml(t.type());
  const int64_t cols = static_cast<int64_t>(t.ne[0]);
  std::vector<float> row(static_cast<size_t>(cols));
  kernels::dequantize_row_ref(type, t.data + static_cast<size_t>(r) * kernels::row_bytes(type, cols), row.data(), cols);
  return row;
}

TEST(Importance, MeansTheSquaresOfEachMatrixInput) {
  testing::SyntheticModelSpec spec;
  spec.tied_output = false;
  const std::vector<uint8_t> bytes = testing::make_synthetic_model(spec);
  auto f = gguf::File::parse(bytes);
  ASSERT_TRUE(f.ok());
  const std::vector<int32_t> tokens = {1, 7, 42, 3, 99, 5, 17, 250, 8};
  auto imp = compute_importance(*f, tokens, 4);  // windows of 4, 4 and 1 tokens
  ASSERT_TRUE(imp.ok()) << imp.status().to_string();
  EXPECT_EQ(imp->tokens, static_cast<int>(tokens.size()));
  // Every matrix of every layer and the head has one weight per column.
  for (const auto& t : f->tensors()) {
    if (t.n_dims != 2 || std::string(t.name) == "token_embd.weight") continue;
    const std::vector<float>* w = imp->find(std::string(t.name));
    ASSERT_NE(w, nullptr) << t.name;
    EXPECT_EQ(w->size(), t.ne[0]) << t.name;
    for (float v : *w) EXPECT_GT(v, 0.0f);
  }
  EXPECT_EQ(imp->find("nothing"), nullptr);
  // Layer 0's attention inputs do not depend on the window: the normed embeddings.
  const gguf::TensorInfo* embd = f->find_tensor("token_embd.weight");
  const gguf::TensorInfo* norm = f->find_tensor("blk.0.attn_norm.weight");
  ASSERT_TRUE(embd && norm);
  auto hp = HParams::from_gguf(*f);
  ASSERT_TRUE(hp.ok());
  const std::vector<float> g = dequant_row(*norm, 0);
  std::vector<double> want(spec.n_embd, 0.0);
  for (int32_t tok : tokens) {
    const std::vector<float> x = dequant_row(*embd, tok);
    double ss = 0.0;
    for (float v : x) ss += static_cast<double>(v) * v;
    const double scale = 1.0 / std::sqrt(ss / spec.n_embd + hp->rms_eps);
    for (size_t i = 0; i < x.size(); ++i) {
      const double h = x[i] * scale * g[i];
      want[i] += h * h / static_cast<double>(tokens.size());
    }
  }
  const std::vector<float>& q = *imp->find("blk.0.attn_q.weight");
  const std::vector<float>& k = *imp->find("blk.0.attn_k.weight");
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(q[i], want[i], 1e-5 * want[i] + 1e-9) << i;
    EXPECT_EQ(q[i], k[i]);
  }
  EXPECT_FALSE(compute_importance(*f, {}, 4).ok());
  EXPECT_FALSE(compute_importance(*f, tokens, 0).ok());
}

double weighted_error(kernels::DType t, const std::vector<float>& x, const std::vector<uint8_t>& q,
                      const std::vector<float>& w) {
  std::vector<float> y(x.size());
  kernels::dequantize_row_ref(t, q.data(), y.data(), static_cast<int64_t>(x.size()));
  double e = 0.0;
  for (size_t i = 0; i < x.size(); ++i) e += w[i] * (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
  return e;
}

TEST(WeightedQuantization, LowersTheWeightedErrorAndLeavesTheUnweightedPathAlone) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::lognormal_distribution<float> skew(0.0f, 1.5f);  // a few columns matter far more
  const int64_t n = 4096;
  std::vector<float> x(n), w(n);
  for (int64_t i = 0; i < n; ++i) {
    x[static_cast<size_t>(i)] = normal(rng) * (i % 97 == 0 ? 6.0f : 1.0f);  // outliers
    w[static_cast<size_t>(i)] = skew(rng);
  }
  for (kernels::DType t : {kernels::DType::kQ4_0, kernels::DType::kQ3_K, kernels::DType::kQ2_K}) {
    ASSERT_TRUE(kernels::quantize_takes_importance(t));
    const size_t nb = kernels::row_bytes(t, n);
    std::vector<uint8_t> plain(nb), weighted(nb);
    kernels::quantize_row_ref(t, x.data(), plain.data(), n);
    kernels::quantize_row_ref_weighted(t, x.data(), weighted.data(), n, w.data());
    const double e_plain = weighted_error(t, x, plain, w), e_weighted = weighted_error(t, x, weighted, w);
    EXPECT_LT(e_weighted, 0.9 * e_plain) << kernels::dtype_name(t);
  }
  // A format without a weighted search is quantize_row_ref, byte for byte.
  EXPECT_FALSE(kernels::quantize_takes_importance(kernels::DType::kQ8_0));
  std::vector<uint8_t> a(kernels::row_bytes(kernels::DType::kQ8_0, n)), b(a.size());
  kernels::quantize_row_ref(kernels::DType::kQ8_0, x.data(), a.data(), n);
  kernels::quantize_row_ref_weighted(kernels::DType::kQ8_0, x.data(), b.data(), n, w.data());
  EXPECT_EQ(a, b);
}

TEST(QuantizeCliImatrix, WeighsTheSearchedFormatsByACalibrationText) {
  REQUIRE_MODEL();
  testing::TempFile plain, weighted, text(".txt");
  text.write(std::string("The quick brown fox jumps over the lazy dog, and the cat sits on the warm mat."));
  const std::string in = testing::default_model_path();
  auto r = testing::run_metro({"quantize", in, plain.path(), "--type", "q3_k"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = testing::run_metro({"quantize", in, weighted.path(), "--type", "q3_k", "--imatrix", text.path(),
                          "--imatrix-tokens", "8", "--imatrix-window", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("211 matrices weighted by importance over 8 tokens"), std::string::npos) << r.err;
  auto a = gguf::File::open(plain.path());
  auto b = gguf::File::open(weighted.path());
  ASSERT_TRUE(a.ok() && b.ok());
  int differ = 0;
  for (const auto& t : a->tensors()) {
    const gguf::TensorInfo* u = b->find_tensor(t.name);
    ASSERT_NE(u, nullptr);
    EXPECT_EQ(u->type(), t.type()) << t.name;
    if (t.n_dims == 2 && std::memcmp(u->data, t.data, t.n_bytes) != 0) ++differ;
  }
  EXPECT_GT(differ, 100);
  r = testing::run_metro({"quantize", in, weighted.path(), "--type", "q4_0", "--imatrix", "/nonexistent.txt"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--imatrix"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace metro::model
