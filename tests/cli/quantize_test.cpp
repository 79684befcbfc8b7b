#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/quant_ref.h"
#include "model/requantize.h"
#include "support/synthetic_model.h"
#include "support/test_util.h"

namespace metro {
namespace {

using metro::testing::run_metro;
using metro::testing::TempFile;

TEST(QuantizeCli, RewritesMatricesAndKeepsEverythingElse) {
  metro::testing::SyntheticModelSpec spec;
  spec.matrix_type = kernels::DType::kF16;
  TempFile in, out;
  in.write(metro::testing::make_synthetic_model(spec));
  auto r = run_metro({"quantize", in.path(), out.path(), "--type", "q8_0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto a = gguf::File::open(in.path());
  auto b = gguf::File::open(out.path());
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().message();
  // Metadata: the same keys with the same values, file_type added.
  for (const auto& kv : a->metadata()) {
    const gguf::Value* v = b->find(kv.key);
    ASSERT_NE(v, nullptr) << kv.key;
    EXPECT_EQ(v->to_display_string(1 << 20), kv.value.to_display_string(1 << 20)) << kv.key;
  }
  EXPECT_EQ(*b->get_u32("general.file_type"), 7u);
  ASSERT_EQ(a->tensors().size(), b->tensors().size());
  for (const auto& t : a->tensors()) {
    const gguf::TensorInfo* u = b->find_tensor(t.name);
    ASSERT_NE(u, nullptr);
    EXPECT_EQ(u->shape_string(), t.shape_string());
    if (t.n_dims == 2) {
      EXPECT_EQ(u->type(), gguf::GgmlType::kQ8_0) << t.name;
      // Values are the originals within Q8_0's rounding.
      const int64_t n = static_cast<int64_t>(t.ne[0]);
      std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
      kernels::dequantize_row_ref(kernels::DType::kF16, t.data, x.data(), n);
      kernels::dequantize_row_ref(kernels::DType::kQ8_0, u->data, y.data(), n);
      for (int64_t i = 0; i < n; i += 32) {
        float amax = 0;
        for (int64_t k = i; k < i + 32; ++k) amax = std::max(amax, std::fabs(x[static_cast<size_t>(k)]));
        for (int64_t k = i; k < i + 32; ++k) {
          ASSERT_NEAR(y[static_cast<size_t>(k)], x[static_cast<size_t>(k)], amax / 127 * 0.5 + amax * 1e-3);
        }
      }
    } else {
      EXPECT_EQ(u->type(), t.type());
      EXPECT_EQ(0, std::memcmp(u->data, t.data, t.n_bytes));
    }
  }
  auto bad = run_metro({"quantize", in.path(), out.path(), "--type", "q3_x"});
  EXPECT_EQ(bad.exit_code, 1);
}

// Rows quantize on many threads into the same bytes as on one, through the library and
// through `metro quantize -t`.
TEST(QuantizeCli, ThreadsDoNotChangeTheBytes) {
  metro::testing::SyntheticModelSpec spec;
  spec.matrix_type = kernels::DType::kF16;
  TempFile in, out;
  in.write(metro::testing::make_synthetic_model(spec));
  auto f = gguf::File::open(in.path());
  ASSERT_TRUE(f.ok());
  for (kernels::DType t : {kernels::DType::kQ2_K, kernels::DType::kQ3_K, kernels::DType::kQ4_K}) {
    model::QuantPlan plan;
    plan.type = t;
    model::RequantizeOptions one, many;
    one.threads = 1;
    many.threads = 3;
    auto a = model::requantize(*f, plan, one);
    auto b = model::requantize(*f, plan, many);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(*a == *b) << kernels::dtype_name(t);
    if (t != kernels::DType::kQ2_K) continue;
    auto r = run_metro({"quantize", in.path(), out.path(), "--type", "q2_k", "-t", "2"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::ifstream got_in(out.path(), std::ios::binary);
    const std::vector<uint8_t> got((std::istreambuf_iterator<char>(got_in)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(got == *a);
  }
}

// Writing over the input (the same file by another path too) is refused before any work and
// leaves it whole; a failed write leaves no file and no temporary behind.
TEST(QuantizeCli, NeverWritesOverItsInputOrLeavesHalfAFile) {
  metro::testing::SyntheticModelSpec spec;
  spec.matrix_type = kernels::DType::kF16;
  TempFile in;
  const std::vector<uint8_t> bytes = metro::testing::make_synthetic_model(spec);
  in.write(bytes);
  const std::string dir = in.path().substr(0, in.path().rfind('/'));
  const std::string name = in.path().substr(in.path().rfind('/') + 1);
  for (const std::string& same : {in.path(), dir + "/./" + name}) {
    auto r = run_metro({"quantize", in.path(), same, "--type", "q8_0"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("is the input file"), std::string::npos) << r.err;
  }
  std::ifstream back(in.path(), std::ios::binary);
  const std::vector<uint8_t> now((std::istreambuf_iterator<char>(back)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(now == bytes) << "the input changed";
  // A directory that does not exist: the error names the path, nothing is left.
  const std::string missing = dir + "/no-such-dir-metro/out.gguf";
  auto r = run_metro({"quantize", in.path(), missing, "--type", "q8_0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no-such-dir-metro/out.gguf.tmp."), std::string::npos) << r.err;
  // A successful write replaces an existing output whole, with no temporary left beside it.
  TempFile out;
  out.write(std::string("old contents"));
  auto ok = run_metro({"quantize", in.path(), out.path(), "--type", "q8_0"});
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_TRUE(gguf::File::open(out.path()).ok());
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().filename().string().find(out.path().substr(out.path().rfind('/') + 1) + ".tmp."),
              std::string::npos)
        << entry.path();
  }
}

// K-quant targets on rows that do not divide into 256-blocks get a 32-block format; a plan
// picks formats per tensor name or pattern and replaces --type; its mistakes are refused.
TEST(QuantizeCli, PlansAndBlockFallbacks) {
  metro::testing::SyntheticModelSpec spec;
  spec.n_embd = 288;  // rows of 288: not a multiple of 256; ffn_down rows are n_ff = 512
  spec.matrix_type = kernels::DType::kF16;
  TempFile in, out, plan;
  in.write(metro::testing::make_synthetic_model(spec));
  auto type_of = [&](const std::string& name) {
    auto f = gguf::File::open(out.path());
    EXPECT_TRUE(f.ok()) << f.status().message();
    const gguf::TensorInfo* t = f.ok() ? f->find_tensor(name) : nullptr;
    return t != nullptr ? t->type() : gguf::GgmlType::kF32;
  };
  auto r = run_metro({"quantize", in.path(), out.path(), "--type", "q2_k"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(type_of("blk.0.ffn_down.weight"), gguf::GgmlType::kQ2_K);
  EXPECT_EQ(type_of("blk.1.attn_q.weight"), gguf::GgmlType::kQ4_0);
  EXPECT_NE(r.err.find("in a 32-block format"), std::string::npos) << r.err;

  plan.write(std::string(R"({"type": "q4_k", "tensors": {"blk.0.ffn_down.weight": "q8_0",
                                                      "blk.*.attn_q.weight": "Q6_K", "blk.1.*": "q5_0"}})"));
  r = run_metro({"quantize", in.path(), out.path(), "--plan", plan.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(type_of("blk.0.ffn_down.weight"), gguf::GgmlType::kQ8_0);  // exact name
  EXPECT_EQ(type_of("blk.0.ffn_up.weight"), gguf::GgmlType::kQ5_0);    // the plan's type, fallen back
  EXPECT_EQ(type_of("blk.1.ffn_down.weight"), gguf::GgmlType::kQ5_0);  // the first matching pattern
  EXPECT_EQ(type_of("blk.1.attn_q.weight"), gguf::GgmlType::kQ8_0);    // Q6_K, fallen back
  EXPECT_EQ(type_of("blk.0.attn_norm.weight"), gguf::GgmlType::kF32);  // 1-D: kept
  {
    auto f = gguf::File::open(out.path());
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(*f->get_u32("general.file_type"), 15u);
  }

  for (const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
           {R"({"tensors": {"blk.*.nothing": "q8_0"}})", "'blk.*.nothing' matches no matrix"},
           {R"({"type": "q4_k", "tensors": {"output.weight": "q9_k"}})", "tensors['output.weight']: unknown format"},
           {R"({"type": "q4_k", "layers": {}})", "unknown key 'layers'"},
           {R"([1, 2])", "is not a JSON object"}}) {
    plan.write(text);
    auto bad = run_metro({"quantize", in.path(), out.path(), "--type", "q8_0", "--plan", plan.path()});
    EXPECT_EQ(bad.exit_code, 1) << text;
    EXPECT_NE(bad.err.find(want), std::string::npos) << text << ": " << bad.err;
  }
  auto none = run_metro({"quantize", in.path(), out.path()});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("--type is required"), std::string::npos) << none.err;
}

// The format a matrix gets by its row width: its own where rows divide into its blocks, a
// K-quant's 32-block stand-in where they divide only into 32s, F16 where not even that
// (a 48-wide shared expert in Q8_0, say), as llama.cpp's quantizer falls back.
TEST(QuantizeCli, RowWidthFallbacks) {
  using kernels::DType;
  EXPECT_EQ(model::format_for_row_width(DType::kQ4_K, 512), DType::kQ4_K);
  EXPECT_EQ(model::format_for_row_width(DType::kQ4_K, 64), DType::kQ5_0);
  EXPECT_EQ(model::format_for_row_width(DType::kQ6_K, 96), DType::kQ8_0);
  EXPECT_EQ(model::format_for_row_width(DType::kQ4_K, 48), DType::kF16);
  EXPECT_EQ(model::format_for_row_width(DType::kQ8_0, 48), DType::kF16);
  EXPECT_EQ(model::format_for_row_width(DType::kQ8_0, 64), DType::kQ8_0);
  EXPECT_EQ(model::format_for_row_width(DType::kF16, 7), DType::kF16);
}

// llama.cpp's mixes by name: Q6_K for the head and for attn_v and ffn_down of the first and
// last eighth of the layers and every third between, the base format elsewhere.
TEST(QuantizeCli, LlamaCppMixesByName) {
  std::vector<std::string> names = {"token_embd.weight", "output.weight", "output_norm.weight"};
  for (int il = 0; il < 16; ++il) {
    for (const char* t : {"attn_q", "attn_v", "ffn_down", "ffn_up"}) names.push_back("blk." + std::to_string(il) + "." + t + ".weight");
  }
  auto plan = model::preset_plan("Q4_K_M", names);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->type, kernels::DType::kQ4_K);
  std::vector<std::string> more;
  for (const auto& [name, type] : plan->tensors) {
    EXPECT_EQ(type, kernels::DType::kQ6_K) << name;
    more.push_back(name);
  }
  // 16 layers: 0, 1 (the first eighth), 14, 15 (the last), and 4, 7, 10, 13 between.
  std::vector<std::string> want = {"output.weight"};
  for (int il : {0, 1, 4, 7, 10, 13, 14, 15}) {
    for (const char* t : {"attn_v", "ffn_down"}) want.push_back("blk." + std::to_string(il) + "." + t + ".weight");
  }
  std::sort(more.begin(), more.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(more, want);
  EXPECT_EQ(model::preset_plan("q5_k_m", names)->type, kernels::DType::kQ5_K);
  EXPECT_FALSE(model::preset_plan("q4_k", names).has_value());
  // A head tied to the embedding: the embedding gets the head's bits.
  names.erase(names.begin() + 1);
  auto tied = model::preset_plan("q4_k_m", names);
  EXPECT_NE(std::find(tied->tensors.begin(), tied->tensors.end(),
                      std::pair<std::string, kernels::DType>{"token_embd.weight", kernels::DType::kQ6_K}),
            tied->tensors.end());

  // Through the command: a synthetic file's matrices in their mix.
  metro::testing::SyntheticModelSpec spec;
  spec.n_embd = 256;
  spec.n_ff = 512;
  spec.n_layer = 8;
  spec.matrix_type = kernels::DType::kF16;
  TempFile in, out;
  in.write(metro::testing::make_synthetic_model(spec));
  auto r = run_metro({"quantize", in.path(), out.path(), "--type", "q4_k_m"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto f = gguf::File::open(out.path());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->find_tensor("blk.0.ffn_down.weight")->type(), gguf::GgmlType::kQ6_K);
  EXPECT_EQ(f->find_tensor("blk.1.ffn_down.weight")->type(), gguf::GgmlType::kQ4_K);
  EXPECT_EQ(f->find_tensor("blk.7.attn_v.weight")->type(), gguf::GgmlType::kQ6_K);
  EXPECT_EQ(f->find_tensor("blk.3.attn_q.weight")->type(), gguf::GgmlType::kQ4_K);
}

}  // namespace
}  // namespace metro
