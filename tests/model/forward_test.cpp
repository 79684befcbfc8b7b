// The fast forward pass against the double-precision reference forward pass, over
// synthetic models in several weight formats, and its invariances: chunking, batching with
// other sequences, paging layout and thread count must not change the logits beyond
// float rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "backends/cpu/cpu_backend.h"
#include "base/clock.h"
#include "kernels/kernel_set.h"
#include "kv/kv_arena.h"
#include "model/model.h"
#include "model/reference_forward.h"
#include "support/model_run.h"
#include "support/synthetic_model.h"

namespace metro::model {
namespace {

using kernels::DType;
using metro::testing::make_synthetic_model;
using metro::testing::sequence_logits;
using metro::testing::SyntheticModelSpec;

using Loaded = metro::testing::LoadedSynthetic;
using metro::testing::random_tokens;
constexpr auto load = metro::testing::load_synthetic;

struct Diff {
  double rel_rms = 0;   // ||a - b|| / ||b|| over everything
  double min_cos = 1;   // worst per-position cosine similarity
  int argmax_mismatch = 0;
};

Diff compare(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  Diff d;
  double num = 0, den = 0;
  for (size_t t = 0; t < b.size(); ++t) {
    double dot = 0, na = 0, nb = 0;
    for (size_t i = 0; i < b[t].size(); ++i) {
      const double x = a[t][i], y = b[t][i];
      num += (x - y) * (x - y);
      den += y * y;
      dot += x * y;
      na += x * x;
      nb += y * y;
    }
    d.min_cos = std::min(d.min_cos, dot / std::sqrt(na * nb));
    auto am = std::max_element(a[t].begin(), a[t].end()) - a[t].begin();
    auto bm = std::max_element(b[t].begin(), b[t].end()) - b[t].begin();
    d.argmax_mismatch += am != bm;
  }
  d.rel_rms = std::sqrt(num / den);
  return d;
}

class ForwardVsReference : public ::testing::TestWithParam<DType> {};

// Tolerances: float weights keep F32 activations, so only float rounding (~1e-6 relative
// per op over a few hundred ops) separates them from the reference. Quantized weights dot
// with activations quantized to 8 bits: each activation carries up to 1/254 of its block's
// max as error, which after norms and two layers stays within a few percent of the logits'
// magnitude; cosine similarity catches direction errors, rel_rms magnitude errors.
TEST_P(ForwardVsReference, MatchesWithinQuantizationError) {
  SyntheticModelSpec spec;
  spec.matrix_type = GetParam();
  spec.embd_type = GetParam() == DType::kF16 ? DType::kF16 : DType::kQ8_0;
  Loaded l = load(spec);
  auto toks = random_tokens(40, static_cast<int>(spec.n_vocab), 5);
  auto f = gguf::File::parse(l.bytes);
  auto ref = reference_forward(*f, toks);
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  auto got = sequence_logits(*l.model, toks, 64);
  Diff d = compare(got, *ref);
  const bool is_float = GetParam() == DType::kF16;
  EXPECT_LT(d.rel_rms, is_float ? 1e-3 : 0.05) << kernels::dtype_name(GetParam());
  EXPECT_GT(d.min_cos, is_float ? 0.99999 : 0.998) << kernels::dtype_name(GetParam());
  EXPECT_LE(d.argmax_mismatch, is_float ? 0 : 4) << kernels::dtype_name(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Formats, ForwardVsReference,
                         ::testing::Values(DType::kF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
                                           DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ6_K),
                         [](const auto& p) { return std::string(kernels::dtype_name(p.param)); });

// A backend that does not read a weight type refuses the model when it binds, naming the
// tensor and the type, instead of stopping the process at the upload. (The CPU backend,
// made to refuse Q4_1, stands in for a device backend without kernels for a type.)
class RefusingBackend final : public backends::Backend {
 public:
  RefusingBackend(std::shared_ptr<backends::Backend> inner, kernels::DType refused)
      : inner_(std::move(inner)), refused_(refused) {}
  std::string_view name() const override { return "refusing"; }
  bool reads(kernels::DType t) const override { return t != refused_ && inner_->reads(t); }
  std::unique_ptr<backends::DeviceMatrix> upload_matrix(const backends::HostMatrix& m, backends::MatrixUse use,
                                                        bool allow_relayout) override {
    EXPECT_NE(m.type, refused_) << "a refused type was uploaded";
    return inner_->upload_matrix(m, use, allow_relayout);
  }
  std::unique_ptr<backends::DeviceVector> upload_vector(std::span<const float> v) override {
    return inner_->upload_vector(v);
  }
  std::unique_ptr<backends::DeviceBuffer> alloc_buffer(size_t bytes) override { return inner_->alloc_buffer(bytes); }
  void copy_bytes(backends::DeviceBuffer& buf, size_t src, size_t dst, size_t n) override {
    inner_->copy_bytes(buf, src, dst, n);
  }
  void write_bytes(backends::DeviceBuffer& buf, size_t offset, std::span<const uint8_t> src) override {
    inner_->write_bytes(buf, offset, src);
  }
  void read_bytes(backends::DeviceBuffer& buf, size_t offset, std::span<uint8_t> dst) override {
    inner_->read_bytes(buf, offset, dst);
  }
  std::unique_ptr<backends::ExecState> make_state(const backends::StateSpec& spec) override {
    return inner_->make_state(spec);
  }
  void execute(std::span<const backends::Op> ops, const backends::StepDesc& step, backends::ExecState& state,
               ThreadPool& pool, backends::StepObserver* observer) override {
    inner_->execute(ops, step, state, pool, observer);
  }

 private:
  std::shared_ptr<backends::Backend> inner_;
  kernels::DType refused_;
};

TEST(Forward, ABackendRefusesAWeightTypeItDoesNotRead) {
  SyntheticModelSpec spec;
  spec.matrix_type = kernels::DType::kQ4_1;
  const std::vector<uint8_t> bytes = make_synthetic_model(spec);
  for (bool refuse : {true, false}) {
    auto f = gguf::File::parse(bytes);
    ASSERT_TRUE(f.ok()) << f.status().message();
    ModelOptions opts;
    opts.backend = std::make_shared<RefusingBackend>(
        backends::make_cpu_backend(kernels::scalar_kernel_set()), refuse ? kernels::DType::kQ4_1 : kernels::DType::kQ2_K);
    auto m = Model::from_file(std::move(*f), opts);
    if (refuse) {
      ASSERT_FALSE(m.ok());
      EXPECT_NE(m.status().message().find("is Q4_1, which the refusing backend does not read"), std::string::npos)
          << m.status().message();
      EXPECT_NE(m.status().message().find("blk.0."), std::string::npos) << m.status().message();
    } else {
      EXPECT_TRUE(m.ok()) << m.status().message();
    }
  }
}

TEST(Forward, QwenStyleBiasesAndNeoxRope) {
  SyntheticModelSpec spec;
  spec.arch = "qwen2";
  spec.qkv_bias = true;
  spec.tied_output = false;
  Loaded l = load(spec);
  EXPECT_TRUE(l.model->hparams().has_qkv_bias);
  auto toks = random_tokens(24, static_cast<int>(spec.n_vocab), 9);
  auto f = gguf::File::parse(l.bytes);
  auto ref = reference_forward(*f, toks);
  ASSERT_TRUE(ref.ok());
  Diff d = compare(sequence_logits(*l.model, toks, 64), *ref);
  EXPECT_LT(d.rel_rms, 1e-3);
}

// qwen3: per-head query and key norms before RoPE, no biases, rotated halves, and a head
// width of its own (n_head * head_dim != n_embd), in F16 and in a quantized format.
TEST(Forward, Qwen3HeadNormsAndWideHeads) {
  for (DType type : {DType::kF16, DType::kQ8_0}) {
    SyntheticModelSpec spec;
    spec.arch = "qwen3";
    spec.qk_norm = true;
    spec.head_dim = 96;
    spec.tied_output = false;
    spec.matrix_type = type;
    Loaded l = load(spec);
    ASSERT_TRUE(l.model);
    EXPECT_TRUE(l.model->hparams().has_qk_norm);
    EXPECT_EQ(l.model->hparams().rope_type, RopeType::kNeox);
    EXPECT_EQ(l.model->hparams().head_dim, 96u);
    auto toks = random_tokens(24, static_cast<int>(spec.n_vocab), 11);
    auto f = gguf::File::parse(l.bytes);
    auto ref = reference_forward(*f, toks);
    ASSERT_TRUE(ref.ok()) << ref.status().message();
    Diff d = compare(sequence_logits(*l.model, toks, 7), *ref);
    const bool is_float = type == DType::kF16;
    EXPECT_LT(d.rel_rms, is_float ? 1e-3 : 0.05) << kernels::dtype_name(type);
    EXPECT_GT(d.min_cos, is_float ? 0.99999 : 0.998) << kernels::dtype_name(type);
  }
  // The norms matter: the same weights without them (the norms are drawn from a generator
  // of their own) give other logits.
  SyntheticModelSpec with;
  with.arch = "qwen3";
  with.qk_norm = true;
  SyntheticModelSpec without = with;
  without.arch = "qwen2";
  without.qk_norm = false;
  auto toks = random_tokens(8, static_cast<int>(with.n_vocab), 3);
  Diff d = compare(sequence_logits(*load(with).model, toks, 8), sequence_logits(*load(without).model, toks, 8));
  EXPECT_GT(d.rel_rms, 0.01);
  // A qwen3 file without the norms is refused by name.
  SyntheticModelSpec bare;
  bare.arch = "qwen3";
  const auto bare_bytes = make_synthetic_model(bare);
  auto f = gguf::File::parse(bare_bytes);
  ASSERT_TRUE(f.ok());
  auto m = Model::from_file(std::move(*f));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("attn_q_norm"), std::string::npos) << m.status().message();
}

// YaRN-scaled rotation through the fast path: the reference rotates in double with the same
// closed-form frequencies, so this checks that the scaling reaches every layer's Q and K
// (and that cos and sin carry the attention scaling); a short original context puts the
// blend inside the 40 positions run here.
TEST(Forward, YarnScaledRopeMatchesReference) {
  SyntheticModelSpec spec;
  spec.arch = "qwen3";
  spec.qk_norm = true;
  spec.yarn_factor = 4.0f;
  spec.yarn_orig_ctx = 64;
  Loaded l = load(spec);
  ASSERT_TRUE(l.model);
  EXPECT_EQ(l.model->hparams().rope_scaling, RopeScaling::kYarn);
  auto toks = random_tokens(40, static_cast<int>(spec.n_vocab), 13);
  auto f = gguf::File::parse(l.bytes);
  auto ref = reference_forward(*f, toks);
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  Diff d = compare(sequence_logits(*l.model, toks, 16), *ref);
  EXPECT_LT(d.rel_rms, 1e-3);
  EXPECT_GT(d.min_cos, 0.99999);
  // Unscaled, the same weights give other logits.
  SyntheticModelSpec plain = spec;
  plain.yarn_factor = 0;
  Diff apart = compare(sequence_logits(*load(plain).model, toks, 16), *ref);
  EXPECT_GT(apart.rel_rms, 1e-3);
}

// phi3: Q, K and V as row ranges of one fused matrix, gate and up as the two halves of
// ffn_up, rotated halves; the reference splits the dense matrices itself.
TEST(Forward, Phi3FusedProjections) {
  for (DType type : {DType::kF16, DType::kQ4_0}) {
    SyntheticModelSpec spec;
    spec.arch = "phi3";
    spec.fused = true;
    spec.tied_output = false;
    spec.matrix_type = type;
    Loaded l = load(spec);
    ASSERT_TRUE(l.model);
    EXPECT_TRUE(l.model->hparams().fused_qkv);
    EXPECT_TRUE(l.model->hparams().fused_gate_up);
    EXPECT_EQ(l.model->hparams().rope_type, RopeType::kNeox);
    auto toks = random_tokens(24, static_cast<int>(spec.n_vocab), 17);
    auto f = gguf::File::parse(l.bytes);
    auto ref = reference_forward(*f, toks);
    ASSERT_TRUE(ref.ok()) << ref.status().message();
    Diff d = compare(sequence_logits(*l.model, toks, 9), *ref);
    const bool is_float = type == DType::kF16;
    EXPECT_LT(d.rel_rms, is_float ? 1e-3 : 0.05) << kernels::dtype_name(type);
    EXPECT_GT(d.min_cos, is_float ? 0.99999 : 0.998) << kernels::dtype_name(type);
  }
}

// gemma3: embeddings scaled by sqrt(n_embd), per-head norms, norms of the attention and FFN
// outputs, GELU gating, and five sliding-window layers rotating at base 10000 to each global
// one at the file's base (7 layers: layer 5 is global). The window (11 tokens) is shorter
// than the input, so the local layers attend to their window only, in steps of 13 tokens
// that cross it.
TEST(Forward, Gemma3LayersAgainstTheReference) {
  SyntheticModelSpec spec;
  spec.arch = "gemma3";
  spec.n_layer = 7;
  spec.qk_norm = true;
  spec.post_norms = true;
  spec.rope_base = 1e6f;
  spec.sliding_window = 11;
  spec.n_ctx = 1024;
  Loaded l = load(spec);
  ASSERT_TRUE(l.model);
  const HParams& hp = l.model->hparams();
  EXPECT_TRUE(hp.has_post_norms && hp.gelu_ffn && hp.has_qk_norm);
  EXPECT_FLOAT_EQ(hp.embd_scale, 16.0f);
  EXPECT_TRUE(hp.is_local_layer(0) && hp.is_local_layer(4) && !hp.is_local_layer(5) && hp.is_local_layer(6));
  EXPECT_EQ(hp.layer_window(0), 11u);
  EXPECT_EQ(hp.layer_window(5), 0u);
  EXPECT_EQ(l.model->max_context(), 1024u);
  auto toks = random_tokens(40, static_cast<int>(spec.n_vocab), 19);
  auto f = gguf::File::parse(l.bytes);
  auto ref = reference_forward(*f, toks);
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  for (int chunk : {13, 1, 40}) {
    Diff d = compare(sequence_logits(*l.model, toks, chunk), *ref);
    EXPECT_LT(d.rel_rms, 1e-3) << "chunk " << chunk;
    EXPECT_GT(d.min_cos, 0.99999) << "chunk " << chunk;
    EXPECT_EQ(d.argmax_mismatch, 0) << "chunk " << chunk;
  }
  // The window changes the answer: the same weights with full attention in every layer.
  spec.sliding_window = 0;
  const std::vector<uint8_t> full_bytes = make_synthetic_model(spec);  // the parsed file views it
  auto full = gguf::File::parse(full_bytes);
  ASSERT_TRUE(full.ok());
  auto ref_full = reference_forward(*full, toks);
  ASSERT_TRUE(ref_full.ok()) << ref_full.status().message();
  EXPECT_GT(compare(*ref_full, *ref).rel_rms, 1e-2);
}

// gemma2: gemma3's layer without the per-head norms, every other layer windowed (from the
// first, at the global rotation), the scaled attention scores and the output logits capped
// by tanh. Caps small enough to bind on these weights; the same weights uncapped give other
// logits, so a path that skipped either cap would fail.
TEST(Forward, Gemma2SoftCapsAndAlternatingWindowsAgainstTheReference) {
  SyntheticModelSpec spec;
  spec.arch = "gemma2";
  spec.n_layer = 4;
  spec.post_norms = true;
  spec.sliding_window = 11;
  spec.attn_softcap = 0.5f;
  spec.final_softcap = 0.8f;
  Loaded l = load(spec);
  ASSERT_TRUE(l.model);
  const HParams& hp = l.model->hparams();
  EXPECT_TRUE(hp.has_post_norms && hp.gelu_ffn && !hp.has_qk_norm);
  EXPECT_EQ(hp.rope_type, RopeType::kNeox);
  EXPECT_FLOAT_EQ(hp.embd_scale, 16.0f);
  EXPECT_TRUE(hp.is_local_layer(0) && !hp.is_local_layer(1) && hp.is_local_layer(2) && !hp.is_local_layer(3));
  EXPECT_EQ(hp.layer_window(0), 11u);
  EXPECT_EQ(hp.layer_window(1), 0u);
  EXPECT_FLOAT_EQ(hp.attn_softcap, 0.5f);
  EXPECT_FLOAT_EQ(hp.final_softcap, 0.8f);
  auto toks = random_tokens(40, static_cast<int>(spec.n_vocab), 23);
  auto f = gguf::File::parse(l.bytes);
  auto ref = reference_forward(*f, toks);
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  for (int chunk : {13, 1, 40}) {
    const auto got = sequence_logits(*l.model, toks, chunk);
    Diff d = compare(got, *ref);
    EXPECT_LT(d.rel_rms, 1e-3) << "chunk " << chunk;
    EXPECT_GT(d.min_cos, 0.99999) << "chunk " << chunk;
    // (No top-token check: a cap this low flattens the largest logits into near-ties.)
    for (const auto& row : got) {
      for (float x : row) ASSERT_LE(std::fabs(x), 0.8f);
    }
  }
  for (int which = 0; which < 2; ++which) {  // each cap alone changes the answer
    SyntheticModelSpec other = spec;
    (which == 0 ? other.attn_softcap : other.final_softcap) = 0.0f;
    const std::vector<uint8_t> bytes = make_synthetic_model(other);
    auto g = gguf::File::parse(bytes);
    ASSERT_TRUE(g.ok());
    auto apart = reference_forward(*g, toks);
    ASSERT_TRUE(apart.ok()) << apart.status().message();
    EXPECT_GT(compare(*apart, *ref).rel_rms, 1e-2) << (which == 0 ? "attention cap" : "final cap");
  }
}

// What a gemma2 file leaves unsaid takes llama.cpp's defaults: a window of 4096 on every
// other layer, caps of 50 (attention) and 30 (logits); the 27B model (46 layers) scales
// queries by 1/sqrt(n_embd / n_head) rather than by its head size. gemma (the first) has
// the embedding scale and GELU but no post norms, windows or caps.
TEST(Forward, GemmaFamilyDefaults) {
  SyntheticModelSpec spec;
  spec.arch = "gemma2";
  spec.post_norms = true;
  {
    const auto bytes = make_synthetic_model(spec);
    auto f = gguf::File::parse(bytes);
    ASSERT_TRUE(f.ok());
    auto hp = HParams::from_gguf(*f);
    ASSERT_TRUE(hp.ok()) << hp.status().message();
    EXPECT_EQ(hp->sliding_window, 4096u);
    EXPECT_EQ(hp->swa_pattern, 2u);
    EXPECT_FLOAT_EQ(hp->attn_softcap, 50.0f);
    EXPECT_FLOAT_EQ(hp->final_softcap, 30.0f);
    EXPECT_FLOAT_EQ(hp->attention_scale(), 1.0f / 8.0f);  // head_dim 64
  }
  spec.n_layer = 46;
  spec.n_embd = 128;
  spec.n_ff = 64;
  spec.head_dim = 16;  // n_embd / n_head is 32
  spec.n_vocab = 64;
  {
    const auto bytes = make_synthetic_model(spec);
    auto f = gguf::File::parse(bytes);
    ASSERT_TRUE(f.ok());
    auto hp = HParams::from_gguf(*f);
    ASSERT_TRUE(hp.ok()) << hp.status().message();
    EXPECT_FLOAT_EQ(hp->attention_scale(), 1.0f / std::sqrt(32.0f));
  }
  SyntheticModelSpec g1;
  g1.arch = "gemma";
  g1.n_head_kv = 1;
  Loaded l = load(g1);
  ASSERT_TRUE(l.model);
  const HParams& hp = l.model->hparams();
  EXPECT_TRUE(hp.gelu_ffn && !hp.has_post_norms && hp.sliding_window == 0 && hp.attn_softcap == 0.0f &&
              hp.final_softcap == 0.0f);
  EXPECT_FLOAT_EQ(hp.embd_scale, 16.0f);
  auto toks = random_tokens(24, static_cast<int>(g1.n_vocab), 29);
  auto f = gguf::File::parse(l.bytes);
  auto ref = reference_forward(*f, toks);
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  Diff d = compare(sequence_logits(*l.model, toks, 7), *ref);
  EXPECT_LT(d.rel_rms, 1e-3);
  EXPECT_GT(d.min_cos, 0.99999);
}

// A head wider than the attention kernels take is refused when the file is read, not
// checked into a crash at the first step.
TEST(Forward, RefusesHeadsWiderThanTheAttentionKernelsTake) {
  SyntheticModelSpec spec;
  spec.n_head = 1;
  spec.n_head_kv = 1;
  spec.head_dim = 512;
  const auto bytes = make_synthetic_model(spec);
  auto f = gguf::File::parse(bytes);
  ASSERT_TRUE(f.ok());
  auto m = Model::from_file(std::move(*f));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("head dimension 512"), std::string::npos) << m.status().message();
}

// mistral: a window without a pattern applies to every layer. On the CPU backend, which
// has windowed attention, the trained context stays the cap; past the window the model
// agrees with the reference forward pass and differs from full attention.
TEST(Forward, SlidingWindowOnEveryLayerOfMistral) {
  SyntheticModelSpec spec;
  spec.arch = "mistral";
  spec.n_ctx = 512;
  spec.sliding_window = 9;
  Loaded l = load(spec);
  ASSERT_TRUE(l.model);
  const HParams& hp = l.model->hparams();
  EXPECT_EQ(hp.sliding_window, 9u);
  for (uint32_t il = 0; il < hp.n_layer; ++il) EXPECT_EQ(hp.layer_window(il), 9u);
  EXPECT_EQ(l.model->max_context(), 512u);
  auto toks = random_tokens(35, static_cast<int>(spec.n_vocab), 23);
  auto f = gguf::File::parse(l.bytes);
  auto ref = reference_forward(*f, toks);
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  for (int chunk : {35, 6}) {
    Diff d = compare(sequence_logits(*l.model, toks, chunk), *ref);
    EXPECT_LT(d.rel_rms, 1e-3) << "chunk " << chunk;
    EXPECT_GT(d.min_cos, 0.9999) << "chunk " << chunk;
  }
  spec.sliding_window = 0;
  Loaded full = load(spec);
  ASSERT_TRUE(full.model);
  EXPECT_EQ(full.model->hparams().layer_window(0), 0u);
  EXPECT_GT(compare(sequence_logits(*full.model, toks, 35), *ref).rel_rms, 1e-2);
}

TEST(Forward, ChunkingAndThreadsDoNotChangeLogits) {
  SyntheticModelSpec spec;
  spec.matrix_type = DType::kQ4_0;
  spec.embd_type = DType::kQ8_0;
  Loaded l = load(spec);
  auto toks = random_tokens(50, static_cast<int>(spec.n_vocab), 11);
  auto whole = sequence_logits(*l.model, toks, 64, 2);
  for (int chunk : {1, 7, 16}) {
    Diff d = compare(sequence_logits(*l.model, toks, chunk, 2), whole);
    EXPECT_LT(d.rel_rms, 1e-5) << "chunk " << chunk;
    EXPECT_EQ(d.argmax_mismatch, 0) << "chunk " << chunk;
  }
  for (int threads : {1, 3}) {
    Diff d = compare(sequence_logits(*l.model, toks, 64, threads), whole);
    EXPECT_EQ(d.rel_rms, 0.0) << "threads " << threads;
  }
  for (int bs : {5, 32}) {
    Diff d = compare(sequence_logits(*l.model, toks, 64, 2, bs), whole);
    EXPECT_LT(d.rel_rms, 1e-6) << "block size " << bs;
  }
}

TEST(Forward, SequencesInOneBatchMatchSequencesAlone) {
  SyntheticModelSpec spec;
  spec.matrix_type = DType::kQ8_0;
  spec.embd_type = DType::kQ8_0;
  Loaded l = load(spec);
  const Model& m = *l.model;
  std::vector<std::vector<int32_t>> seqs = {random_tokens(9, 300, 1), random_tokens(17, 300, 2),
                                            random_tokens(3, 300, 3)};
  // Shuffled, non-contiguous block ids for each sequence in one shared arena.
  const int bs = 4;
  kernels::KvPageLayout layout{DType::kF16, bs, static_cast<int>(m.hparams().n_head_kv),
                               static_cast<int>(m.hparams().head_dim)};
  kv::KvArena arena(m.hparams(), layout, 16);
  std::vector<int32_t> ids(16);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(4));
  std::vector<std::vector<int32_t>> owned = {{ids[0], ids[1], ids[2]},
                                             {ids[3], ids[4], ids[5], ids[6], ids[7]},
                                             {ids[8]}};
  std::vector<std::span<const int32_t>> tables(owned.begin(), owned.end());
  KvView view = arena.view(tables);
  ThreadPool pool(2);
  WorkspaceLimits lim{64, 64, 4, 8};
  Workspace ws = m.make_workspace(lim);
  Batch b;
  for (int s = 0; s < 3; ++s) {
    for (size_t i = 0; i < seqs[static_cast<size_t>(s)].size(); ++i) {
      b.add(seqs[static_cast<size_t>(s)][i], static_cast<int32_t>(i), s, true);
    }
  }
  auto out = m.forward(b, view, ws, pool);
  ASSERT_TRUE(out.ok()) << out.status().message();
  int row = 0;
  for (int s = 0; s < 3; ++s) {
    auto alone = sequence_logits(m, seqs[static_cast<size_t>(s)], 64);
    std::vector<std::vector<float>> batched;
    for (size_t i = 0; i < seqs[static_cast<size_t>(s)].size(); ++i) {
      auto v = out->row(row++);
      batched.emplace_back(v.begin(), v.end());
    }
    Diff d = compare(batched, alone);
    EXPECT_LT(d.rel_rms, 1e-5) << "sequence " << s;
    EXPECT_EQ(d.argmax_mismatch, 0);
  }
}

// An observer sees every op of the step once, with its kind; the attention time it reports
// (what the engine's step cost fit prices apart) is a part of the step, not all of it.
// Observed steps run the elementwise ops op by op instead of row by row: the same
// arithmetic on every row, so the same bits.
TEST(Forward, ObserverSeesEveryOpAndChangesNoBits) {
  SyntheticModelSpec spec;
  spec.n_layer = 3;
  Loaded l = load(spec);
  const Model& m = *l.model;
  ThreadPool pool(2);
  Workspace ws = m.make_workspace({64, 64, 2, 8});
  auto toks = random_tokens(40, static_cast<int>(spec.n_vocab), 21);
  Batch b;
  for (size_t i = 0; i < toks.size(); ++i) b.add(toks[i], static_cast<int32_t>(i), 0, i % 3 == 0);
  SequenceKv kv_plain(m.hparams(), 64);
  auto plain = m.forward(b, kv_plain.view(), ws, pool);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  const std::vector<float> want(plain->logits, plain->logits + plain->n_rows * plain->n_vocab);

  SequenceKv kv(m.hparams(), 64);
  backends::StepProfile profile;
  ForwardOptions fo;
  fo.observer = &profile;
  const Stopwatch sw;
  auto out = m.forward(b, kv.view(), ws, pool, fo);
  const double forward_s = sw.elapsed_s();
  ASSERT_TRUE(out.ok()) << out.status().message();
  ASSERT_EQ(out->n_rows * out->n_vocab, static_cast<int>(want.size()));
  EXPECT_EQ(0, std::memcmp(want.data(), out->logits, want.size() * sizeof(float)));

  using backends::OpKind;
  const int L = static_cast<int>(spec.n_layer);
  EXPECT_EQ(profile.calls(OpKind::kEmbed), 1);
  EXPECT_EQ(profile.calls(OpKind::kRopeAngles), 1);
  EXPECT_EQ(profile.calls(OpKind::kProject), 4 * L + 1);  // qkv, o, gate+up, down; the head
  EXPECT_EQ(profile.calls(OpKind::kRope), 2 * L);
  EXPECT_EQ(profile.calls(OpKind::kKvStore), L);
  EXPECT_EQ(profile.calls(OpKind::kAttention), L);
  EXPECT_EQ(profile.calls(OpKind::kAdd), 2 * L);
  EXPECT_EQ(profile.calls(OpKind::kSwiglu), L);
  EXPECT_EQ(profile.calls(OpKind::kRmsNorm), 2 * L + 1);  // attn and ffn norms; the head's
  EXPECT_EQ(profile.calls(OpKind::kAddBias), 0);
  EXPECT_EQ(profile.calls(OpKind::kAllReduce), 0);
  EXPECT_GT(profile.seconds(OpKind::kAttention), 0.0);
  EXPECT_GT(profile.seconds(OpKind::kProject), 0.0);
  EXPECT_LT(profile.total_seconds(), forward_s);
}

TEST(Forward, RefusesMalformedBatches) {
  SyntheticModelSpec spec;
  Loaded l = load(spec);
  const Model& m = *l.model;
  ThreadPool pool(1);
  Workspace ws = m.make_workspace({8, 8, 2, 4});
  SequenceKv kv(m.hparams(), 32);
  Batch gap;
  gap.add(1, 0, 0, true);
  gap.add(2, 2, 0, true);
  EXPECT_FALSE(m.forward(gap, kv.view(), ws, pool).ok());
  Batch bad_id;
  bad_id.add(300, 0, 0, true);
  EXPECT_FALSE(m.forward(bad_id, kv.view(), ws, pool).ok());
  Batch bad_seq;
  bad_seq.add(1, 0, 3, true);
  EXPECT_FALSE(m.forward(bad_seq, kv.view(), ws, pool).ok());
  Batch too_long;
  for (int i = 0; i < 9; ++i) too_long.add(1, i, 0, false);
  EXPECT_FALSE(m.forward(too_long, kv.view(), ws, pool).ok());
  Batch beyond_kv;
  beyond_kv.add(1, 40, 0, true);
  EXPECT_FALSE(m.forward(beyond_kv, kv.view(), ws, pool).ok());
}

}  // namespace
}  // namespace metro::model
