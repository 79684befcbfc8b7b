// LoRA adapters merged at load (model/lora.h): against llama.cpp, which applies the same
// adapter at run time, on a tiny llama file (tests/fixtures/lora, made by make_fixture.py
// there); the merged bytes of a quantized matrix against the sum computed here; refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "kv/kv_arena.h"
#include "kernels/quant_ref.h"
#include "model/lora.h"
#include "model/model.h"
#include "support/model_run.h"
#include "support/synthetic_model.h"
#include "support/test_util.h"

namespace metro::model {
namespace {

using Rows = std::vector<std::vector<float>>;
using metro::testing::max_abs_diff;
using metro::testing::sequence_logits;

std::string fixture(const std::string& name) { return metro::testing::source_path("tests/fixtures/lora/" + name); }

// metro merges the adapter into the F32 weights; llama.cpp adds B (A x) at run time. The
// logits agree closely at both scales (they move by up to 5.5 from the base model's).
TEST(Lora, MatchesLlamaCppAtTwoScales) {
  std::ifstream in(fixture("llama_tiny_lora_logits.json"));
  const auto fx = nlohmann::json::parse(in);
  const auto toks = fx["tokens"].get<std::vector<int32_t>>();
  Rows base_ref;
  for (const auto& c : fx["cases"]) {
    if (c["scale"].get<double>() == 0.0) base_ref = c["logits"].get<Rows>();
  }
  ASSERT_FALSE(base_ref.empty());
  for (const auto& c : fx["cases"]) {
    const float scale = c["scale"].get<float>();
    ModelOptions opts;
    if (scale != 0.0f) opts.lora = {{fixture("llama_tiny_lora.gguf"), scale}};
    auto m = Model::load(fixture("llama_tiny.gguf"), opts);
    ASSERT_TRUE(m.ok()) << m.status().message();
    const Rows got = sequence_logits(**m, toks, static_cast<int>(toks.size()));
    const Rows want = c["logits"].get<Rows>();
    const double d = max_abs_diff(got, want);
    std::printf("lora: scale %.1f: largest difference %.4f from llama.cpp's logits (%.4f from the base model's)\n",
                scale, d, max_abs_diff(got, base_ref));
    EXPECT_LT(d, 0.01) << "scale " << scale;
    if (scale != 0.0f) {
      EXPECT_GT(max_abs_diff(got, base_ref), 1.0) << "scale " << scale;
    }
  }
}

// The same adapter kept apart and applied per token at run time (ModelOptions::adapters):
// one model with the adapter at scale 1 as adapter 1 and at 0.5 as adapter 2 matches
// llama.cpp for each, and three sequences of one batch, one per adapter and one with none,
// each get the logits they get alone.
TEST(Lora, RunTimeAdaptersShareABatchAndMatchLlamaCpp) {
  std::ifstream in(fixture("llama_tiny_lora_logits.json"));
  const auto fx = nlohmann::json::parse(in);
  const auto toks = fx["tokens"].get<std::vector<int32_t>>();
  ModelOptions opts;
  opts.adapters = {{fixture("llama_tiny_lora.gguf"), 1.0f}, {fixture("llama_tiny_lora.gguf"), 0.5f}};
  auto m = Model::load(fixture("llama_tiny.gguf"), opts);
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_EQ((*m)->n_adapters(), 2);
  const int n = static_cast<int>(toks.size());
  std::vector<Rows> alone(3);
  for (const auto& c : fx["cases"]) {
    const float scale = c["scale"].get<float>();
    const int16_t id = scale == 1.0f ? 1 : scale == 0.5f ? 2 : 0;
    for (int chunk : {n, 5}) {
      const Rows got = sequence_logits(**m, toks, chunk, 2, 16, 0, id);
      ASSERT_EQ(got.size(), toks.size());
      const double d = max_abs_diff(got, c["logits"].get<Rows>());
      std::printf("lora at run time: adapter %d (scale %.1f), chunk %d: largest difference %.4f from llama.cpp's\n", id,
                  scale, chunk, d);
      EXPECT_LT(d, 0.01) << "scale " << scale;
      if (chunk == n) alone[static_cast<size_t>(id)] = got;
    }
  }
  EXPECT_GT(max_abs_diff(alone[1], alone[0]), 1.0);
  EXPECT_GT(max_abs_diff(alone[2], alone[0]), 1.0);
  EXPECT_GT(max_abs_diff(alone[1], alone[2]), 0.5);
  // One batch: sequence s runs with adapter s, its tokens at positions 0.. in its own blocks.
  const int bs = 8, blocks = (n + bs - 1) / bs;
  kernels::KvPageLayout layout{kernels::DType::kF16, bs, static_cast<int>((*m)->hparams().n_head_kv),
                               static_cast<int>((*m)->hparams().head_dim)};
  kv::KvArena arena((*m)->hparams(), layout, 3 * blocks);
  std::vector<std::vector<int32_t>> owned(3);
  for (int s = 0; s < 3; ++s) {
    for (int j = 0; j < blocks; ++j) owned[static_cast<size_t>(s)].push_back(s * blocks + j);
  }
  std::vector<std::span<const int32_t>> tables(owned.begin(), owned.end());
  ThreadPool pool(2);
  Workspace ws = (*m)->make_workspace({3 * n, 3 * n, 3, blocks});
  Batch b;
  for (int s : {2, 0, 1}) {
    for (int i = 0; i < n; ++i) b.add(toks[static_cast<size_t>(i)], i, s, true, static_cast<int16_t>(s));
  }
  Rows rows;
  ASSERT_TRUE(metro::testing::forward_rows(**m, b, arena.view(tables), ws, pool, rows));
  ASSERT_EQ(rows.size(), 3 * toks.size());
  for (int k = 0; k < 3; ++k) {
    const int s = k == 0 ? 2 : k - 1;
    const Rows part(rows.begin() + k * n, rows.begin() + (k + 1) * n);
    EXPECT_LT(max_abs_diff(part, alone[static_cast<size_t>(s)]), 1e-4) << "adapter " << s;
  }
  // An adapter the model does not hold is refused.
  Batch bad;
  bad.add(toks[0], 0, 0, true, 3);
  EXPECT_FALSE((*m)->forward(bad, arena.view(tables), ws, pool).ok());
}

// An adapter written here: rank 2 on one matrix of a synthetic model.
std::vector<uint8_t> adapter_bytes(const std::string& arch, const std::string& target, uint64_t n_in, uint64_t n_out,
                                   uint64_t rank, float alpha, bool with_b = true) {
  gguf::Writer w;
  w.add_string("general.architecture", arch);
  w.add_string("general.type", "adapter");
  w.add_string("adapter.type", "lora");
  w.add_f32("adapter.lora.alpha", alpha);
  std::vector<float> a(n_in * rank), b(rank * n_out);
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * static_cast<float>(i)) * 0.2f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.11f * static_cast<float>(i)) * 0.3f;
  EXPECT_TRUE(w.add_tensor(target + ".lora_a", gguf::GgmlType::kF32, {n_in, rank},
                           {reinterpret_cast<const uint8_t*>(a.data()), a.size() * 4}).ok());
  if (with_b) {
    EXPECT_TRUE(w.add_tensor(target + ".lora_b", gguf::GgmlType::kF32, {rank, n_out},
                             {reinterpret_cast<const uint8_t*>(b.data()), b.size() * 4}).ok());
  }
  return w.serialize();
}

// phi3's fused tensors at run time: an adapter of attn_qkv (or of the gate-and-up ffn_up)
// adapts each matrix bound from its rows with those rows of B, as merging does to the
// whole tensor (F32 weights: the merged sum is exact but for its rounding).
TEST(Lora, RunTimeAdaptersOfFusedTensorsMatchMerging) {
  metro::testing::SyntheticModelSpec spec;
  spec.arch = "phi3";
  spec.fused = true;
  spec.tied_output = false;
  spec.matrix_type = kernels::DType::kF32;
  const auto base = metro::testing::make_synthetic_model(spec);
  const uint64_t n_embd = spec.n_embd, hd = n_embd / spec.n_head;
  const uint64_t n_qkv = (spec.n_head + 2 * spec.n_head_kv) * hd;
  const std::string dir = ::testing::TempDir();
  const std::vector<std::pair<std::string, std::vector<uint8_t>>> files = {
      {dir + "/fused_qkv_lora.gguf", adapter_bytes("phi3", "blk.1.attn_qkv.weight", n_embd, n_qkv, 3, 6.0f)},
      {dir + "/fused_up_lora.gguf", adapter_bytes("phi3", "blk.0.ffn_up.weight", n_embd, 2 * uint64_t{spec.n_ff}, 2, 4.0f)}};
  for (const auto& [path, bytes] : files) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  auto file = gguf::File::parse(base);
  ASSERT_TRUE(file.ok());
  ModelOptions opts;
  opts.adapters = {{files[0].first, 1.0f}, {files[1].first, 1.0f}};
  auto m = Model::from_file(std::move(*file), opts);
  ASSERT_TRUE(m.ok()) << m.status().message();
  std::vector<int32_t> toks;
  for (int i = 0; i < 20; ++i) toks.push_back((i * 29 + 3) % static_cast<int>(spec.n_vocab));
  const Rows plain = sequence_logits(**m, toks, 20, 2, 16, 0, 0);
  for (int16_t id : {1, 2}) {
    const Rows run_time = sequence_logits(**m, toks, 20, 2, 16, 0, id);
    auto f = gguf::File::parse(base);
    ASSERT_TRUE(f.ok());
    const LoraSpec one{files[static_cast<size_t>(id - 1)].first, 1.0f};
    auto merged_bytes = merge_lora(*f, std::span<const LoraSpec>(&one, 1));
    ASSERT_TRUE(merged_bytes.ok()) << merged_bytes.status().message();
    auto mf = gguf::File::parse(*merged_bytes);
    ASSERT_TRUE(mf.ok());
    auto merged = Model::from_file(std::move(*mf));
    ASSERT_TRUE(merged.ok()) << merged.status().message();
    const Rows want = sequence_logits(**merged, toks, 20);
    EXPECT_LT(max_abs_diff(run_time, want), 2e-3) << "adapter " << id;
    EXPECT_GT(max_abs_diff(run_time, plain), 0.05) << "adapter " << id;
  }
  for (const auto& f : files) std::remove(f.first.c_str());
}

// On a Q8_0 matrix: each merged value lies within about half a quantization step of base + s B A
// (computed here in double), and every other tensor keeps its bytes.
TEST(Lora, MergesIntoAQuantizedMatrix) {
  metro::testing::SyntheticModelSpec spec;
  spec.matrix_type = kernels::DType::kQ8_0;
  const auto bytes = metro::testing::make_synthetic_model(spec);
  auto base = gguf::File::parse(bytes);
  ASSERT_TRUE(base.ok());
  const std::string target = "blk.1.attn_q.weight";
  const gguf::TensorInfo* w = base->find_tensor(target);
  ASSERT_NE(w, nullptr);
  const uint64_t n_in = w->ne[0], n_out = w->ne[1], rank = 2;
  const float alpha = 6.0f, scale = 0.75f, s = scale * alpha / static_cast<float>(rank);
  metro::testing::TempFile ad(".gguf");
  ad.write(adapter_bytes("llama", target, n_in, n_out, rank, alpha));
  const std::vector<LoraSpec> specs = {{ad.path(), scale}};
  LoraReport rep;
  auto merged = merge_lora(*base, specs, &rep);
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  EXPECT_EQ(rep.matrices, 1u);
  auto out = gguf::File::parse(*merged);
  ASSERT_TRUE(out.ok());
  auto adf = gguf::File::open(ad.path());
  ASSERT_TRUE(adf.ok());
  const auto* a = reinterpret_cast<const float*>(adf->find_tensor(target + ".lora_a")->data);
  const auto* b = reinterpret_cast<const float*>(adf->find_tensor(target + ".lora_b")->data);
  const gguf::TensorInfo* mw = out->find_tensor(target);
  ASSERT_NE(mw, nullptr);
  EXPECT_EQ(mw->type(), w->type());
  const size_t rb = kernels::row_bytes(kernels::DType::kQ8_0, static_cast<int64_t>(n_in));
  std::vector<float> before(n_in), after(n_in);
  double moved = 0;
  for (uint64_t o = 0; o < n_out; ++o) {
    kernels::dequantize_row_ref(kernels::DType::kQ8_0, w->data + o * rb, before.data(), static_cast<int64_t>(n_in));
    kernels::dequantize_row_ref(kernels::DType::kQ8_0, mw->data + o * rb, after.data(), static_cast<int64_t>(n_in));
    std::vector<double> want(n_in);
    for (uint64_t i = 0; i < n_in; ++i) {
      double d = 0;
      for (uint64_t r = 0; r < rank; ++r) d += static_cast<double>(b[o * rank + r]) * a[r * n_in + i];
      want[i] = before[i] + s * d;
    }
    for (uint64_t blk = 0; blk < n_in / 32; ++blk) {
      double amax = 0;
      for (uint64_t i = blk * 32; i < blk * 32 + 32; ++i) amax = std::max(amax, std::fabs(want[i]));
      for (uint64_t i = blk * 32; i < blk * 32 + 32; ++i) {
        // Half a step, and a little for the step itself being stored in F16.
        ASSERT_NEAR(after[i], want[i], amax / 127.0 * 0.6 + 1e-6) << "row " << o << " col " << i;
        moved = std::max(moved, std::fabs(want[i] - before[i]));
      }
    }
  }
  EXPECT_GT(moved, 0.05);  // the adapter does change the matrix
  for (const auto& t : base->tensors()) {
    if (t.name == target) continue;
    const gguf::TensorInfo* o = out->find_tensor(t.name);
    ASSERT_NE(o, nullptr) << t.name;
    ASSERT_EQ(o->n_bytes, t.n_bytes);
    EXPECT_EQ(0, std::memcmp(o->data, t.data, t.n_bytes)) << t.name;
  }
}

TEST(Lora, RefusesWhatDoesNotFit) {
  metro::testing::SyntheticModelSpec spec;
  const auto bytes = metro::testing::make_synthetic_model(spec);
  auto base = gguf::File::parse(bytes);
  ASSERT_TRUE(base.ok());
  const uint64_t n = spec.n_embd;
  auto refused = [&](const std::vector<uint8_t>& adapter, const std::string& want) {
    metro::testing::TempFile f(".gguf");
    f.write(adapter);
    const std::vector<LoraSpec> specs = {{f.path(), 1.0f}};
    auto r = merge_lora(*base, specs);
    ASSERT_FALSE(r.ok()) << want;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
  };
  refused(bytes, "is not a LoRA adapter");
  refused(adapter_bytes("qwen2", "blk.0.attn_q.weight", n, n, 2, 4.0f), "is for architecture 'qwen2'");
  refused(adapter_bytes("llama", "blk.0.attn_q.weight", n + 32, n, 2, 4.0f), "is [256, 256] but its halves");
  refused(adapter_bytes("llama", "blk.9.attn_q.weight", n, n, 2, 4.0f), "not a matrix of the model");
  refused(adapter_bytes("llama", "blk.0.attn_q.weight", n, n, 2, 4.0f, false), "has lora_a but not lora_b");
  metro::testing::TempFile ok(".gguf");
  ok.write(adapter_bytes("llama", "blk.0.attn_q.weight", n, n, 2, 4.0f));
  const std::vector<LoraSpec> nan_scale = {{ok.path(), std::nanf("")}};
  EXPECT_FALSE(merge_lora(*base, nan_scale).ok());
  const std::vector<LoraSpec> missing = {{"/nonexistent/adapter.gguf", 1.0f}};
  EXPECT_FALSE(merge_lora(*base, missing).ok());
}

// The flags: `metro run --lora` and `--lora-scaled` load the adapted model; a bad adapter
// stops the command with its reason.
TEST(Lora, CommandLineFlags) {
  const std::string model = fixture("llama_tiny.gguf"), adapter = fixture("llama_tiny_lora.gguf");
  auto base = metro::testing::run_metro({"run", "-m", model, "-p", "abc", "-n", "8", "--temp", "0"});
  ASSERT_EQ(base.exit_code, 0) << base.err;
  auto adapted = metro::testing::run_metro({"run", "-m", model, "--lora", adapter, "-p", "abc", "-n", "8", "--temp", "0"});
  ASSERT_EQ(adapted.exit_code, 0) << adapted.err;
  auto scaled = metro::testing::run_metro(
      {"run", "-m", model, "--lora-scaled", adapter, "1.0", "-p", "abc", "-n", "8", "--temp", "0"});
  ASSERT_EQ(scaled.exit_code, 0) << scaled.err;
  EXPECT_EQ(adapted.out, scaled.out);
  EXPECT_NE(base.out, adapted.out);
  auto bad = metro::testing::run_metro({"run", "-m", model, "--lora", model, "-p", "abc", "-n", "2"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("is not a LoRA adapter"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace metro::model
